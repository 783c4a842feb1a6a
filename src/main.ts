import { createApp } from "./app.js";
import type { Config } from "./config.js";
import { openDatabase } from "./db/database.js";
import { createLogger } from "./log.js";
import { listen } from "./server.js";

/**
 * `meshwork serve`: open the database, migrate, listen, and shut down
 * cleanly on SIGTERM/SIGINT (stop accepting, let in-flight RPCs finish
 * within the grace period, end streams, close the database, exit 0).
 */
export async function serve(config: Config): Promise<void> {
  const log = createLogger(config.logLevel);
  const database = await openDatabase({ url: config.databaseUrl, dataDir: config.dataDir });
  const app = createApp(database, config, log);
  const server = await listen(app, config.listen);
  log.info(
    {
      url: server.url,
      database: database.kind === "pglite" ? `pglite:${config.dataDir}/db` : "postgres",
      auth: config.auth,
    },
    "meshwork listening",
  );
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, "shutting down");
    try {
      await server.close();
      await database.close();
      log.info("stopped");
      process.exit(0);
    } catch (error) {
      log.error({ err: error }, "shutdown failed");
      process.exit(1);
    }
  };
  process.on("SIGTERM", () => void stop("SIGTERM"));
  process.on("SIGINT", () => void stop("SIGINT"));
}
