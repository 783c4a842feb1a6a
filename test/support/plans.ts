import postgres from "postgres";

/**
 * A one-connection client to `url` whose notices land in `plans`: once
 * `explainEverything` has run on it, that is every plan auto_explain logs.
 */
export function noticeClient(url: string, plans: string[]): postgres.Sql {
  return postgres(url, {
    max: 1,
    onnotice: (n) => {
      if (typeof n.message === "string") plans.push(n.message);
    },
  });
}

/**
 * From now on, the plan of every statement on this connection is sent to it
 * as a notice (auto_explain): with `nested`, the statements inside functions
 * too; with `analyze`, the actual rows (and, with `timing`, times).
 */
export async function explainEverything(
  sql: postgres.Sql,
  options: { nested?: boolean; analyze?: boolean; timing?: boolean } = {},
): Promise<void> {
  await sql`load 'auto_explain'`;
  await sql`set auto_explain.log_min_duration = 0`;
  if (options.nested) await sql`set auto_explain.log_nested_statements = on`;
  if (options.analyze) await sql`set auto_explain.log_analyze = on`;
  if (options.timing === false) await sql`set auto_explain.log_timing = off`;
  await sql`set client_min_messages = log`;
}
