import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { createClient, createRouterTransport } from "@connectrpc/connect";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import type { App } from "../../src/app.js";
import type { Database } from "../../src/db/database.js";
import { connectPostgres } from "../../src/db/postgres-client.js";
import { rowsOf } from "../../src/db/values.js";
import { createDispatchStore } from "../../src/fleet/dispatch-store.js";
import { createRoutes, rpcInterceptors } from "../../src/server.js";
import { againWhileUnavailable, until } from "../support/bounded.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { appOn, uniqueWorkload } from "../support/harness.js";

// Two replicas (two apps, two pools) deliver pushed tasks from one
// PostgreSQL database to one worker, whose server counts the requests per
// (task, attempt): each attempt is delivered once (a delivery's claim is a
// row lock and claimed_until, fleet/dispatch-store.ts), and an attempt
// placed again before any dispatcher ran is never sent.
describe.skipIf(!onPostgres)("dispatch on two replicas", () => {
  let tdb: TestDatabase;
  let replica: Database;
  let a: App;
  let b: App;
  let server: Server;
  let url = "";
  const seen = new Map<string, number>();
  beforeAll(async () => {
    tdb = await createTestDatabase();
    replica = await tdb.reopen();
    a = appOn(tdb.database, { sweepIntervalMs: 50 });
    b = appOn(replica, { sweepIntervalMs: 50 });
    server = createServer((req, res) => {
      let body = "";
      req.on("data", (c: Buffer) => {
        body += c.toString("utf8");
      });
      req.on("end", () => {
        const { taskId, attempt } = JSON.parse(body) as { taskId: string; attempt: number };
        const key = `${taskId}/${attempt}`;
        seen.set(key, (seen.get(key) ?? 0) + 1);
        // A little later, so that requests overlap the other replica's passes.
        setTimeout(() => res.writeHead(202).end(), 5);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    await a?.dispatcher.stop();
    await b?.dispatcher.stop();
    server?.closeAllConnections();
    await new Promise<void>((resolve) => server?.close(() => resolve()));
    await tdb?.drop();
  });

  const clients = (app: App) => {
    const transport = createRouterTransport(createRoutes(app), {
      router: { interceptors: rpcInterceptors(app) },
    });
    return {
      fleet: createClient(FleetService, transport),
      tasks: createClient(TaskService, transport),
    };
  };

  it("delivers each attempt once, and never a stale one", async () => {
    const ca = clients(a);
    const cb = clients(b);
    const w = uniqueWorkload();
    await ca.fleet.registerWorker({
      name: "pushed",
      capabilities: [w],
      apiBaseUrl: url,
      maxConcurrency: 1000,
    });
    a.dispatcher.start();
    b.dispatcher.start();
    const n = 120;
    const { tasks } = await ca.tasks.createTasks({
      tasks: Array.from({ length: n }, () => ({ workload: w, dispatch: true })),
    });
    const ids = tasks.map((t) => t.taskId);
    // Every tenth is placed again at once (attempt 2): its first attempt may
    // or may not have gone out before; never after its re-placement. The
    // 120 placements queue for the one worker's lock, holding pool
    // connections: on a loaded machine some are answered `unavailable`
    // (no connection free within 3 s), and are made again, as a client does.
    await Promise.all(
      ids.map(async (taskId, i) => {
        const c = i % 2 === 0 ? ca : cb;
        await againWhileUnavailable(() => c.tasks.scheduleTask({ taskId }));
        if (i % 10 === 0) {
          await againWhileUnavailable(() => (i % 4 === 0 ? cb : ca).tasks.retryTask({ taskId }));
        }
      }),
    );
    // Both replicas pass at once, again and again, besides their timers.
    await until(async () => {
      await Promise.all([a.dispatcher.runOnce(), b.dispatcher.runOnce()]);
      const [row] = await rowsOf<{ n: number }>(
        a.database.db,
        sql`select count(*)::int as n from deliveries where state = 'ACCEPTED'`,
      );
      return Number(row?.n) === n;
    }, 30_000);
    for (let i = 0; i < 5; i++) await Promise.all([a.dispatcher.runOnce(), b.dispatcher.runOnce()]);
    const twice = [...seen].filter(([, count]) => count > 1);
    expect(twice).toEqual([]);
    for (const [i, id] of ids.entries()) {
      expect(seen.get(`${id}/${i % 10 === 0 ? 2 : 1}`)).toBe(1);
    }
    // Events: one `dispatch` event per request, each accepted.
    const [events] = await rowsOf<{ n: number }>(
      a.database.db,
      sql`select count(*)::int as n from task_events where kind = 'dispatch' and detail->>'outcome' = 'accepted'`,
    );
    expect(Number(events?.n)).toBe([...seen.values()].reduce((x, y) => x + y, 0));
  });

  it("sends only the new attempt of a task placed again before any dispatcher ran", async () => {
    await a.dispatcher.stop();
    await b.dispatcher.stop();
    const ca = clients(a);
    const w = uniqueWorkload();
    await ca.fleet.registerWorker({
      name: "pushed-2",
      capabilities: [w],
      apiBaseUrl: url,
      maxConcurrency: 10,
    });
    const { task } = await ca.tasks.createTask({ workload: w, dispatch: true });
    const taskId = task?.taskId ?? "";
    await ca.tasks.scheduleTask({ taskId });
    await ca.tasks.retryTask({ taskId });
    await Promise.all([a.dispatcher.runOnce(), b.dispatcher.runOnce()]);
    await Promise.all([a.dispatcher.runOnce(), b.dispatcher.runOnce()]);
    expect(seen.get(`${taskId}/1`)).toBeUndefined();
    expect(seen.get(`${taskId}/2`)).toBe(1);
  });

  // task_events has no foreign key to tasks (migration 0023): a delete
  // takes its tasks' events with it (a statement trigger), and a
  // delivery's event is written only while its task is there, locked FOR
  // KEY SHARE. A delete in flight when the event is recorded makes the
  // record wait for it, then write nothing: no event outlives its task.
  it("records no dispatch event for a task deleted while the record waits", async () => {
    const ca = clients(a);
    const { task } = await ca.tasks.createTask({ workload: uniqueWorkload() });
    const taskId = task?.taskId ?? "";
    const worker = (await ca.fleet.registerWorker({ name: "gone" })).workerId;
    // Two connections: one reserved for the delete's transaction, one to look.
    const admin = connectPostgres(tdb.url ?? "", { max: 2, onnotice: () => {} });
    try {
      const deleter = await admin.reserve();
      await deleter`begin`;
      await deleter`delete from tasks where id = ${taskId}`;
      const recording = createDispatchStore(a.database.db).record(
        { taskId, attempt: 1, workerId: worker },
        { outcome: "accepted", httpStatus: 202, durationMs: 1, url, error: "" },
        "ACCEPTED",
        null,
      );
      await until(async () => {
        const [row] = await admin`select count(*)::int as n from pg_stat_activity
          where datname = current_database() and wait_event_type = 'Lock'`;
        return row?.n === 1;
      }, 5000);
      await deleter`commit`;
      deleter.release();
      expect(await recording).toBeUndefined();
      const [left] =
        await admin`select count(*)::int as n from task_events where task_id = ${taskId}`;
      expect(left?.n).toBe(0);
    } finally {
      // Ends the delete's transaction too, should a step above have failed.
      await admin.end({ timeout: 1 });
    }
  });
});
