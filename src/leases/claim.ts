import { eq, getTableColumns, Subquery, sql } from "drizzle-orm";
import { liveLeases } from "../core/task-sql.js";
import type { Db } from "../db/database.js";
import { type TaskRow, tasks, workers } from "../db/schema/index.js";

/** The worker a claim is for, with what it offers this time. */
export interface ClaimingWorker {
  id: string;
  capabilities: string[];
  labels: Record<string, string>;
  /** Stands for the registered max_concurrency in this claim (REST workers state it per claim). */
  maxConcurrency?: number | undefined;
}

const p = sql.placeholder;

/**
 * The claim: one statement calling `meshwork_claim` (migration
 * 0006_claim.sql, redefined in 0008 with the `concurrency` parameter), the single SQL text that says which tasks a worker may
 * take, in which order, and the lease each gets, with the plan decisions
 * that keep it O(claimed) whatever the backlog and the statistics. Rows
 * come back best first (`with ordinality` keeps the function's order).
 *
 * Prepared once per store: building a Drizzle query costs more than the query.
 */
export function createClaimStatement(db: Db) {
  const columns = getTableColumns(tasks);
  // The function's rows under the table's name, so that Drizzle maps them
  // to TaskRow exactly as it maps a select from the table.
  const claimed = new Subquery(
    sql`select * from meshwork_claim(${p("worker")}::uuid, ${p("caps")}::text[], ${p("labels")}::jsonb, ${p("max")}::int, ${p("concurrency")}::int) with ordinality`,
    columns,
    "tasks",
  );
  const statement = db
    .select(columns)
    .from(claimed as unknown as typeof tasks)
    .orderBy(sql`ordinality`)
    .prepare("meshwork_claim");
  return (worker: ClaimingWorker, max: number): Promise<TaskRow[]> =>
    statement.execute({
      worker: worker.id,
      caps: worker.capabilities,
      labels: JSON.stringify(worker.labels),
      max,
      concurrency: worker.maxConcurrency ?? null,
    });
}

/** How a worker's cap stands: the cap that applies and the slots it leaves free. */
export interface Slots {
  /** The cap: the claim's max_concurrency override, else the registered one. */
  maxConcurrency: number;
  /** The cap minus the worker's live leases, never below 0. */
  free: number;
}

/**
 * A worker's free slots, counted now by the function the claim uses
 * (`meshwork_live_leases`, one index lookup on tasks_lease_worker_idx):
 * what a claim response reports after its claims. An unknown worker has
 * none. Prepared once per store.
 */
export function createSlotsStatement(db: Db) {
  const statement = db
    .select({ maxConcurrency: workers.maxConcurrency, live: liveLeases(workers.id) })
    .from(workers)
    .where(eq(workers.id, p("worker")))
    .prepare("meshwork_claim_slots");
  return async (worker: ClaimingWorker): Promise<Slots> => {
    const [row] = await statement.execute({ worker: worker.id });
    const maxConcurrency = worker.maxConcurrency ?? row?.maxConcurrency ?? 0;
    if (!row) return { maxConcurrency, free: 0 };
    return { maxConcurrency, free: Math.max(0, maxConcurrency - Number(row.live)) };
  };
}
