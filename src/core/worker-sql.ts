import { type SQL, sql } from "drizzle-orm";
import { workers } from "../db/schema/index.js";
import { asBoolean } from "../db/values.js";

/**
 * Whether a worker is LOST: no heartbeat for 3 intervals, by the database
 * clock. Derived on read, never stored; ACTIVE otherwise.
 */
export function workerLost(heartbeatIntervalSeconds: number): SQL.Aliased<boolean> | SQL<boolean> {
  return sql<boolean>`(${workers.lastHeartbeatAt} < now() - make_interval(secs => ${3 * heartbeatIntervalSeconds}))`.mapWith(
    asBoolean,
  );
}
