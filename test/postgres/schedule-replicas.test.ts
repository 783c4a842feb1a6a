import { create } from "@bufbuild/protobuf";
import { sql } from "drizzle-orm";
import type postgres from "postgres";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateScheduleRequestSchema, OverlapPolicy } from "../../gen/meshwork/v1/schedule_pb.js";
import type { App } from "../../src/app.js";
import type { Database } from "../../src/db/database.js";
import { connectPostgres } from "../../src/db/postgres-client.js";
import { rowsOf } from "../../src/db/values.js";
import { fromCreateSchedule } from "../../src/schedules/convert.js";
import { createScheduleStore, type ScheduleRow } from "../../src/schedules/store.js";
import { createScheduledTask } from "../../src/schedules/ticker.js";
import { until } from "../support/bounded.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { appOn, uniqueWorkload } from "../support/harness.js";

// Two replicas (two apps, two connection pools) tick the same schedules on
// one PostgreSQL database; one is killed mid-way. Every tick has exactly
// one task: a tick's task and its schedule's move commit in one
// transaction that holds the schedule's row (schedules/store.ts tickDue).
describe.skipIf(!onPostgres)("schedule ticks on two replicas", () => {
  let tdb: TestDatabase;
  let replica: Database;
  let a: App;
  let b: App;
  let admin: postgres.Sql;
  beforeAll(async () => {
    tdb = await createTestDatabase();
    replica = await tdb.reopen();
    a = appOn(tdb.database, { sweepIntervalMs: 100 });
    b = appOn(replica, { sweepIntervalMs: 100 });
    admin = connectPostgres(tdb.url ?? "", { max: 1, onnotice: () => {} });
  });
  afterAll(async () => {
    await a?.scheduleTicker.stop();
    await b?.scheduleTicker.stop();
    await admin?.end();
    await tdb?.drop();
  });

  const dbName = () => new URL(tdb.url ?? "").pathname.slice(1);

  const schedule = async (name: string, cron: string, over: Record<string, unknown> = {}) => {
    const now = await a.schedules.now();
    const req = create(CreateScheduleRequestSchema, {
      name,
      cron,
      template: { workload: uniqueWorkload() },
      overlapPolicy: OverlapPolicy.ALLOW,
      ...over,
    });
    const { row } = await a.schedules.create(
      crypto.randomUUID(),
      fromCreateSchedule(req, "tester", "", now),
    );
    return row;
  };

  const keysOf = async (id: string) =>
    (
      await rowsOf<{ k: string; n: number }>(
        tdb.database.db,
        sql`select idempotency_key as k, count(*)::int as n from tasks
            where schedule_id = ${id} group by 1 order by 1`,
      )
    ).map((r) => ({ k: r.k, n: r.n }));

  it("a replica killed inside a tick's transaction leaves the tick to the other, once", async () => {
    const row = await schedule(`held-${uniqueWorkload("")}`, "@yearly");
    await a.database.db.execute(
      sql`update schedules set next_run_at = date_trunc('second', now()) - interval '1 second'
          where id = ${row.id}`,
    );
    // Replica B claims the tick and creates its task, then hangs before its commit.
    let release: () => void = () => {};
    const gate = new Promise<void>((r) => {
      release = r;
    });
    let holding: () => void = () => {};
    const held = new Promise<void>((r) => {
      holding = r;
    });
    const bTick = createScheduleStore(replica.db).tickDue(async (due) => {
      await createScheduledTask(b, due, due.row.nextRunAt);
      holding();
      await gate;
      return { nextRunAt: null, lastRunAt: due.now, lastTaskId: undefined };
    });
    const bFailed = bTick.then(
      () => false,
      () => true,
    );
    await held;
    // Replica A passes the locked schedule by: nothing for it meanwhile.
    await a.scheduleTicker.runOnce();
    expect(await keysOf(row.id)).toEqual([]);
    // B is killed (its connection terminated): its transaction rolls back.
    await admin`select pg_terminate_backend(pid) from pg_stat_activity
      where datname = ${dbName()} and state like 'idle in transaction%'`;
    release();
    expect(await bFailed).toBe(true);
    await a.scheduleTicker.runOnce();
    const keys = await keysOf(row.id);
    expect(keys.length).toBe(1);
    expect(keys[0]?.n).toBe(1);
    expect(keys[0]?.k).toMatch(new RegExp(`^schedule:${row.id}:`));
  });

  it("every-second schedules on two tickers, one killed mid-way: each tick has exactly one task", async () => {
    const made: ScheduleRow[] = [];
    for (let i = 0; i < 6; i++) {
      made.push(await schedule(`sec-${i}-${uniqueWorkload("")}`, "* * * * * *"));
    }
    a.scheduleTicker.start();
    b.scheduleTicker.start();
    const ticked = async (min: number) => {
      for (const s of made) if ((await keysOf(s.id)).length < min) return false;
      return true;
    };
    await until(() => ticked(2), 20_000);
    // Kill replica B: its pool closes under whatever it was doing.
    await replica.close();
    const seen = await Promise.all(made.map(async (s) => (await keysOf(s.id)).length));
    await until(async () => {
      for (const [i, s] of made.entries()) {
        if ((await keysOf(s.id)).length < (seen[i] ?? 0) + 3) return false;
      }
      return true;
    }, 20_000);
    await a.scheduleTicker.stop();
    await b.scheduleTicker.stop();
    for (const s of made) {
      const keys = await keysOf(s.id);
      expect(keys.every((k) => k.n === 1)).toBe(true);
      // No tick skipped: the keys are consecutive seconds from the first tick to the last run.
      const times = keys.map((k) => Date.parse(k.k.slice(`schedule:${s.id}:`.length)));
      const [last] = await rowsOf<{ ms: number | string }>(
        tdb.database.db,
        sql`select floor(extract(epoch from last_run_at) * 1000)::float8 as ms
            from schedules where id = ${s.id}`,
      );
      expect(times.at(-1)).toBe(Number(last?.ms));
      expect(times[0]).toBe(s.nextRunAt?.getTime());
      expect(times.length).toBe(((times.at(-1) ?? 0) - (times[0] ?? 0)) / 1000 + 1);
    }
  });
});
