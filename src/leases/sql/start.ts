import { getTableColumns, sql } from "drizzle-orm";
import { leaseHeld } from "../../core/lease-check.js";
import type { Db } from "../../db/database.js";
import { tasks } from "../../db/schema/index.js";

const columns = getTableColumns(tasks);

/** StartTask: ASSIGNED → RUNNING for the holder of a pushed lease. */
export function startStatement(db: Db) {
  return (
    db
      .update(tasks)
      .set({
        state: "RUNNING",
        startedAt: sql`coalesce(${tasks.startedAt}, now())`,
        updatedAt: sql`now()`,
      })
      // RUNNING already under the same lease: started again, so a retried
      // StartTask succeeds (the lease check admits ASSIGNED and RUNNING).
      .where(leaseHeld)
      .returning(columns)
      .prepare("meshwork_start")
  );
}
