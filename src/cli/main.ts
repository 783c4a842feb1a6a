import { existsSync, readFileSync } from "node:fs";
import { ConfigError, loadConfig } from "../config.js";
import { StartupError } from "../data-dir-lock.js";
import { serveUsage } from "./serve-usage.js";
import { closest } from "./suggest.js";

// Each command's module is loaded when that command runs: `serve` loads no
// client code, a client command no server code (bench/RESULTS.md, Memory).

const usage = `Usage: meshwork <command> [flags]

Commands:
  serve       run the coordinator (default flags: embedded database in ./.meshwork, 127.0.0.1:8080)
  token       create | list | revoke bearer tokens (admin)
  knowledge   export | import | sync knowledge entries between coordinators
  task        create | get | why | list | cancel | rerun | retry | watch tasks
  worker      list | drain | undrain | deregister | prune workers
  fleet       status: tasks by state, backlog, worker load
  artifact    get | put | verify artifact bytes (put: task inputs)
  work        run a command per task as a worker (--workload W -- COMMAND [ARGS])
  share       list | set | delete share-tree weights (fair share)
  limit       list | set | delete concurrency limits by key
  rate        list | set | delete rates by key
  schedule    create | get | list | pause | resume | delete | trigger cron schedules

Each command takes --help; operator commands take --url, --token and --json.

Run 'meshwork serve --help' for the serve flags, 'meshwork --version' for the version.
`;

/**
 * The version in package.json: two levels up from src/cli/, three from the
 * build's dist/src/cli/.
 */
function version(): string {
  const fromSrc = new URL("../../package.json", import.meta.url);
  const url = existsSync(fromSrc) ? fromSrc : new URL("../../../package.json", import.meta.url);
  const pkg = JSON.parse(readFileSync(url, "utf8"));
  return String(pkg.version);
}

/** The `meshwork` command line. */
export async function run(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (command === "--version" || command === "version" || command === "-v") {
    process.stdout.write(`meshwork ${version()}\n`);
    return 0;
  }
  if (command === undefined || command === "help" || command === "--help" || command === "-h") {
    process.stdout.write(usage);
    return command === undefined ? 2 : 0;
  }
  if (command === "serve") {
    if (rest.includes("--help") || rest.includes("-h")) {
      process.stdout.write(serveUsage);
      return 0;
    }
    try {
      const config = loadConfig(rest);
      const { serve } = await import("../main.js");
      await serve(config);
    } catch (error) {
      if (error instanceof ConfigError) {
        process.stderr.write(`meshwork serve: ${error.message}\n`);
        return 2;
      }
      if (error instanceof StartupError) {
        process.stderr.write(`meshwork serve: ${error.message}\n`);
        return 1;
      }
      const code = (error as { code?: string }).code;
      if (code === "EADDRINUSE" || code === "EACCES" || code === "EADDRNOTAVAIL") {
        process.stderr.write(`meshwork serve: cannot listen: ${(error as Error).message}\n`);
        return 1;
      }
      if (code === "ENOENT" || code === "ERR_OSSL_PEM_NO_START_LINE") {
        process.stderr.write(`meshwork serve: ${(error as Error).message}\n`);
        return 1;
      }
      throw error;
    }
    return -1; // keeps running until a signal
  }
  if (command === "token") {
    const { tokenCommand } = await import("./token.js");
    return await tokenCommand(rest);
  }
  if (command === "knowledge") {
    try {
      const { knowledgeCommand } = await import("./knowledge.js");
      return await knowledgeCommand(rest);
    } catch (error) {
      process.stderr.write(`meshwork knowledge: ${(error as Error).message}\n`);
      return 1;
    }
  }
  const operator: Record<string, () => Promise<(args: string[]) => Promise<number>>> = {
    task: async () => (await import("./task.js")).taskCommand,
    worker: async () => (await import("./worker.js")).workerCommand,
    fleet: async () => (await import("./fleet.js")).fleetCommand,
    artifact: async () => (await import("./artifact.js")).artifactCommand,
    work: async () => (await import("./work.js")).workCommand,
    share: async () => (args) =>
      import("./scheduling.js").then((m) => m.schedulingCommand("share", args)),
    limit: async () => (args) =>
      import("./scheduling.js").then((m) => m.schedulingCommand("limit", args)),
    rate: async () => (args) =>
      import("./scheduling.js").then((m) => m.schedulingCommand("rate", args)),
    schedule: async () => (await import("./schedule.js")).scheduleCommand,
  };
  const load = Object.hasOwn(operator, command) ? operator[command] : undefined;
  if (load) return (await load())(rest);
  const near = closest(command, ["serve", "token", "knowledge", ...Object.keys(operator)]);
  process.stderr.write(
    `meshwork: unknown command ${JSON.stringify(command.slice(0, 64))}${near ? ` (did you mean ${JSON.stringify(near)}?)` : ""}\n\n${usage}`,
  );
  return 2;
}

const code = await run(process.argv.slice(2));
if (code >= 0) process.exit(code);
