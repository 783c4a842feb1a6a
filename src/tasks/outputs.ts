import { sql } from "drizzle-orm";
import type { Db } from "../db/database.js";
import type { TaskRow } from "../db/schema/index.js";
import { rowsOf } from "../db/values.js";

/**
 * The dependency_outputs of tasks (Task.dependency_outputs, Claim's too):
 * for each task, the OUTPUT artifacts of the final attempt of each
 * dependency that SUCCEEDED, as `<name>/<filename>` → artifact id, and its
 * result artifact as `<name>/result`. `<name>` is the dependency's ref when
 * it has one that no other dependency of the task shares, else its task
 * id. One query for all the tasks given; none when none has dependencies.
 */
export async function dependencyOutputs(
  db: Db,
  rows: readonly Pick<TaskRow, "id" | "dependsOn">[],
): Promise<Map<string, Record<string, string>>> {
  const out = new Map<string, Record<string, string>>();
  const ids = rows.filter((r) => r.dependsOn.length > 0).map((r) => r.id);
  if (ids.length === 0) return out;
  const found = await rowsOf<{
    task_id: string;
    dep_id: string;
    ref: string;
    result_id: string | null;
    artifact_id: string | null;
    filename: string | null;
  }>(
    db,
    sql`select d.task_id, dep.id as dep_id, dep.ref, dep.result->>'artifactId' as result_id,
        a.id as artifact_id, a.filename
      from task_dependencies d
        join tasks dep on dep.id = d.depends_on and dep.state = 'SUCCEEDED'
        left join artifacts a on a.task_id = dep.id and a.kind = 'OUTPUT' and a.attempt = dep.attempt
      where d.task_id = any (${`{${ids.join(",")}}`}::uuid[])
      order by d.task_id, dep.id, a.created_at, a.id`,
  );
  const refs = new Map<string, Map<string, number>>();
  for (const f of found) {
    const seen = refs.get(f.task_id) ?? new Map<string, number>();
    refs.set(f.task_id, seen);
    if (f.ref !== "" && !seen.has(`${f.dep_id}`)) {
      seen.set(f.dep_id, 0);
      seen.set(`ref:${f.ref}`, (seen.get(`ref:${f.ref}`) ?? 0) + 1);
    }
  }
  for (const f of found) {
    const seen = refs.get(f.task_id);
    const name = f.ref !== "" && seen?.get(`ref:${f.ref}`) === 1 ? f.ref : String(f.dep_id);
    const map = out.get(f.task_id) ?? {};
    out.set(f.task_id, map);
    if (f.result_id) map[`${name}/result`] = f.result_id;
    if (f.artifact_id && f.filename) map[`${name}/${f.filename}`] = String(f.artifact_id);
  }
  return out;
}
