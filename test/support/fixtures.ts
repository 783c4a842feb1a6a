import { eq, sql } from "drizzle-orm";
import type { Db } from "../../src/db/database.js";
import { tasks, workers } from "../../src/db/schema/index.js";
import type { NewTask } from "../../src/tasks/store.js";

/** A valid NewTask with partial overrides. */
export function newTask(overrides: Partial<NewTask> = {}): NewTask {
  return {
    name: "t",
    workload: "work",
    requiredCapabilities: [],
    affinity: {},
    priority: 0,
    deadline: null,
    parameters: { n: 1 },
    steps: null,
    maxAttempts: 3,
    leaseSeconds: 60,
    backoff: { initialMs: 1000, maxMs: 300_000, multiplier: 2 },
    idempotencyKey: null,
    correlationId: "",
    traceParent: "",
    traceState: "",
    input: null,
    resources: { slots: 1 },
    requirements: [],
    preferences: [],
    share: "default",
    shareGiven: false,
    concurrencyKey: "",
    runAt: null,
    delayMs: null,
    ref: "",
    dependsOn: [],
    dependencyPolicy: "ALL_SUCCEEDED",
    timeoutSeconds: null,
    rateKey: "",
    ...overrides,
  };
}

/** Moves a task's lease into the past, as if its TTL had run out (no sleeping). */
export async function expireLease(db: Db, taskId: string): Promise<void> {
  await db
    .update(tasks)
    .set({ leaseExpiresAt: sql`now() - interval '1 second'` })
    .where(eq(tasks.id, taskId));
}

/** Moves a retried task's not_before into the past. */
export async function endBackoff(db: Db, taskId: string): Promise<void> {
  await db
    .update(tasks)
    .set({ notBefore: sql`now() - interval '1 millisecond'` })
    .where(eq(tasks.id, taskId));
}

/** Registers a worker row with a known id (claims only serve registered, undrained workers). */
export async function insertWorker(
  db: Db,
  id: string,
  drained = false,
  maxConcurrency = 10_000,
): Promise<void> {
  await db
    .insert(workers)
    .values({ id, name: "fixture", drained, maxConcurrency })
    .onConflictDoNothing();
}
