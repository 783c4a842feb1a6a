import { type Client, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { sql } from "drizzle-orm";
import type postgres from "postgres";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { LeaseService } from "../../gen/meshwork/v1/lease_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import { type Database, openDatabase } from "../../src/db/database.js";
import { connectPostgres } from "../../src/db/postgres-client.js";
import type { RunningServer } from "../../src/server.js";
import { listen } from "../../src/server.js";
import { until } from "../support/bounded.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { appOn, uniqueWorkload } from "../support/harness.js";

const poolSize = 2;
const acquireTimeoutMs = 400;
/** Far longer than the acquire timeout: a call that hangs in a queue ends as deadline_exceeded. */
const clientDeadlineMs = 8000;

/**
 * Every pool connection busy (here: statements blocked on a row lock held
 * by another session) must not make calls hang: claims and heartbeats fail
 * fast with `unavailable`, and the sweeper, on its own connection, keeps
 * expiring leases. Once the blocker goes, everything works again.
 */
describe.skipIf(!onPostgres)("PostgreSQL pool exhaustion", () => {
  let tdb: TestDatabase;
  let database: Database;
  let server: RunningServer;
  let admin: postgres.Sql;
  let fleet: Client<typeof FleetService>;
  let tasks: Client<typeof TaskService>;
  let leases: Client<typeof LeaseService>;

  beforeAll(async () => {
    tdb = await createTestDatabase();
    database = await openDatabase({
      url: tdb.url,
      dataDir: "",
      poolSize,
      acquireTimeoutMs,
    });
    server = await listen(appOn(database, { sweepIntervalMs: 200 }), "127.0.0.1:0");
    const transport = createGrpcTransport({ baseUrl: server.url });
    fleet = createClient(FleetService, transport);
    tasks = createClient(TaskService, transport);
    leases = createClient(LeaseService, transport);
    admin = connectPostgres(tdb.url ?? "", { max: 3, onnotice: () => {} });
  });

  afterAll(async () => {
    await server?.close();
    await database?.close();
    await admin?.end();
    await tdb?.drop();
  });

  const timeoutMs = clientDeadlineMs;

  it("refuses claims and heartbeats with unavailable, keeps sweeping, and recovers", async () => {
    const workload = uniqueWorkload("pool");
    const blocked = (await fleet.registerWorker({ name: "blocked" })).workerId;
    const victim = (await fleet.registerWorker({ name: "victim", capabilities: [workload] }))
      .workerId;
    const { task } = await tasks.createTask({ workload, maxAttempts: 3 });
    const taskId = task?.taskId ?? "";
    const [claim] = (await leases.claimTasks({ workerId: victim })).claims;
    expect(claim?.taskId).toBe(taskId);

    // Another session holds the blocked worker's row; one Heartbeat per pool
    // connection waits on it, so every connection is busy.
    const holder = await admin.reserve();
    await holder`begin`;
    await holder`select 1 from workers where id = ${blocked} for update`;
    const stuck = Promise.allSettled(
      Array.from({ length: poolSize }, () => fleet.heartbeat({ workerId: blocked }, { timeoutMs })),
    );
    try {
      await until(async () => {
        const [row] = await admin`select count(*)::int as n from pg_stat_activity
          where application_name = 'meshwork' and wait_event_type = 'Lock'`;
        return row?.n === poolSize;
      }, 5000);

      const heartbeat = await failure(fleet.heartbeat({ workerId: victim }, { timeoutMs }));
      expect(await outcome(Promise.reject(heartbeat))).toMatchObject({
        code: "Unavailable",
        message: "the database is unavailable for a moment; retry",
      });
      expect(heartbeat.metadata.get("retry-after")).toBe("1");
      expect(
        await outcome(leases.claimTasks({ workerId: victim, waitSeconds: 0 }, { timeoutMs })),
      ).toMatchObject({ code: "Unavailable" });

      // The victim's lease expires while the pool is exhausted: the sweeper
      // still returns the task to PENDING.
      await admin`update tasks set lease_expires_at = now() - interval '1 second'
        where id = ${taskId}`;
      await until(async () => {
        const [row] = await admin`select state from tasks where id = ${taskId}`;
        return row?.state === "PENDING";
      }, 5000);
      // ... and requests are still refused at that moment.
      expect(
        await outcome(leases.claimTasks({ workerId: victim, waitSeconds: 0 }, { timeoutMs })),
      ).toMatchObject({ code: "Unavailable" });
    } finally {
      await holder`rollback`;
      holder.release();
    }

    // The blocked calls went through once the lock was released.
    for (const r of await stuck) expect(r.status).toBe("fulfilled");
    expect((await fleet.heartbeat({ workerId: victim }, { timeoutMs })).drained).toBe(false);
    const [again] = (await leases.claimTasks({ workerId: victim }, { timeoutMs })).claims;
    expect(again).toMatchObject({ taskId, attempt: 2 });
  });

  it("a transaction holds one slot: transactions run on a pool of one", async () => {
    const one = await openDatabase({ url: tdb.url, dataDir: "", poolSize: 1, acquireTimeoutMs });
    try {
      const run = (n: number) =>
        one.db.transaction(async (tx) => {
          await tx.execute(sql`select ${n}::int`);
          await tx.transaction(async (inner) => inner.execute(sql`select pg_sleep(0.05)`));
          const rows = await tx.execute(sql`select ${n}::int as n`);
          return (rows as unknown as { n: number }[])[0];
        });
      // Four at once on one connection: they wait their turn (well within
      // the timeout), none waits for a second slot.
      expect(await Promise.all([1, 2, 3, 4].map(run))).toEqual([1, 2, 3, 4].map((n) => ({ n })));
    } finally {
      await one.close();
    }
  });
});

async function failure(call: Promise<unknown>): Promise<ConnectError> {
  try {
    await call;
  } catch (error) {
    return ConnectError.from(error);
  }
  throw new Error("the call succeeded");
}
