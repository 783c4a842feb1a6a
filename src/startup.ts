import { adminTokenPath, type Config, shownUrl } from "./config.js";
import { postgresPlace } from "./db/postgres-url.js";

/**
 * Whether log lines are for a person: `--log-format pretty`, or `auto` (the
 * default) with stdout on a terminal. Otherwise they are JSON, one object a
 * line, for whatever collects them.
 */
export function wantsPrettyLogs(config: Pick<Config, "logFormat">, stdoutIsTty: boolean): boolean {
  return config.logFormat === "pretty" || (config.logFormat === "auto" && stdoutIsTty);
}

/**
 * The lines a person sees once the coordinator is up: where it listens,
 * which database it uses (never a password), where the admin token is, and
 * what to try next. Printed instead of the "meshwork listening" log line
 * when logs are pretty.
 */
export function readySummary(config: Config, url: string): string {
  const database = config.databaseUrl
    ? `PostgreSQL at ${postgresPlace(config.databaseUrl)}`
    : `embedded (PGlite) in ${config.dataDir}/db`;
  const token = adminTokenPath(config.dataDir);
  // The CLI finds the admin token in ./.meshwork unless told another data directory.
  const dataDirFlag = [".meshwork", "./.meshwork"].includes(config.dataDir)
    ? ""
    : ` --data-dir ${config.dataDir}`;
  const bearer = config.auth === "on" ? ` -H "Authorization: Bearer $(cat ${token})"` : "";
  const lines = [
    "",
    `  Meshwork is ready at ${url}`,
    "",
    `  Dashboard     ${url}/`,
    `  Database      ${database}`,
    config.auth === "on"
      ? `  Admin token   ${token} (keep it secret: it can do everything)`
      : "  Auth          off (loopback only): every caller is admin",
    `  Metrics       ${url}/metrics`,
    ...(config.otelEndpoint
      ? [`  Traces        exported to ${shownUrl(config.otelEndpoint)}/v1/traces`]
      : []),
    "",
    "  Try:",
    `    curl${bearer} \\`,
    `      -H 'content-type: application/json' -d '{"workload":"hello"}' \\`,
    `      ${url}/meshwork.v1.TaskService/CreateTask`,
    // A worker token of its own (a new name each time: names are unique),
    // made with the admin token even if the shell holds another one.
    config.auth === "on"
      ? `    export MESHWORK_TOKEN=$(MESHWORK_TOKEN= npx meshwork token create --url ${url}${dataDirFlag} --role worker --name worker-$(date +%s))`
      : "    export MESHWORK_TOKEN=unused   # --auth off: any value will do",
    `    npx meshwork work --url ${url} --workload hello -- echo done`,
    "",
    "  Stop with Ctrl-C.",
    "",
  ];
  return `${lines.join("\n")}\n`;
}
