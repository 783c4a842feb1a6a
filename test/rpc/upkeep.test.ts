import type { SQL } from "drizzle-orm";
import { PgDialect } from "drizzle-orm/pg-core";
import pino from "pino";
import type postgres from "postgres";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { createApp } from "../../src/app.js";
import { connectPostgres } from "../../src/db/postgres-client.js";
import { createUpkeep, type Vacuumed } from "../../src/db/upkeep.js";
import { createTestDatabase, onPostgres } from "../support/database.js";
import {
  createHarness,
  type Harness,
  registerWorker,
  testConfig,
  uniqueWorkload,
} from "../support/harness.js";
import { textSink } from "../support/text-sink.js";

// The coordinator's own upkeep of its tables (db/upkeep.ts, --vacuum): the
// dead rows every claim and completion leave are read from PostgreSQL's
// statistics and vacuumed away, on PostgreSQL and on PGlite (which runs no
// autovacuum); an open transaction that keeps them is named.

/** A metric's value for the given label set, or undefined. */
function metric(text: string, name: string, labels = ""): number | undefined {
  const line = text.split("\n").find((l) => l.startsWith(`${name}${labels ? `{${labels}}` : ""} `));
  return line === undefined ? undefined : Number(line.split(" ")[1]);
}

/** Runs `tasks` tasks through the queue: created, claimed, completed (two dead task rows each). */
async function churn(h: Harness, tasks: number) {
  const workload = uniqueWorkload("churn");
  for (let done = 0; done < tasks; done += 500) {
    await h.tasks.createTasks({ tasks: Array.from({ length: 500 }, () => ({ workload })) });
  }
  const workerId = await registerWorker(h, [workload]);
  for (let left = tasks; left > 0; ) {
    const { claims } = await h.leases.claimTasks({ workerId, maxTasks: 100 });
    expect(claims.length).toBeGreaterThan(0);
    const { results } = await h.leases.completeTasks({
      completions: claims.map((c) => ({ taskId: c.taskId, workerId, attempt: c.attempt })),
    });
    expect(results.every((r) => r.outcome.case === "task")).toBe(true);
    left -= claims.length;
  }
}

/** Runs the upkeep until `done` says so (PostgreSQL's statistics arrive within seconds), at most ~60 s. */
async function upkeepUntil(h: Harness, done: (metrics: string) => boolean): Promise<string> {
  for (let i = 0; i < 120; i++) {
    await h.app.runUpkeep();
    const text = await h.app.metrics.scrape();
    if (done(text)) return text;
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error("the upkeep never got there");
}

/**
 * Runs `body` while another session (`application`) holds a transaction
 * open, begun by `begin` on it; `body` gets its pid. A failed assertion
 * leaves the transaction open: the session is ended without waiting.
 */
async function whileHeld(
  h: Harness,
  application: string,
  begin: (tx: postgres.ReservedSql) => Promise<unknown>,
  body: (pid: number) => Promise<void>,
) {
  const holder = connectPostgres(h.db.url ?? "", {
    max: 1,
    onnotice: () => {},
    connection: { application_name: application },
  });
  try {
    const reserved = await holder.reserve();
    await begin(reserved);
    const [{ pid } = { pid: 0 }] = await reserved<
      { pid: number }[]
    >`select pg_backend_pid() as pid`;
    await body(pid);
    await reserved`rollback`;
    reserved.release();
  } finally {
    await holder.end({ timeout: 1 });
  }
}

/**
 * The upkeep's oldest transaction once it is `pid`'s (a statement of the
 * app's own that was running already may come first for a moment), at
 * most ~5 s; what it read last otherwise.
 */
async function oldestOnceHeldBy(upkeep: ReturnType<typeof createUpkeep>, pid: number) {
  let oldest = (await upkeep.read()).oldest;
  for (let i = 0; i < 50 && oldest?.pid !== pid; i++) {
    await new Promise((r) => setTimeout(r, 100));
    oldest = (await upkeep.read()).oldest;
  }
  return oldest;
}

describe("database upkeep, --vacuum on", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await createHarness({ vacuum: true });
  });
  afterAll(() => h?.close());

  it("vacuums the task table once claims and completions have left dead rows, and counts it", async () => {
    await churn(h, 3000);
    const text = await upkeepUntil(
      h,
      (m) => (metric(m, "meshwork_db_vacuums_total", 'table="tasks"') ?? 0) >= 1,
    );
    // What the vacuum removed is gone from the figures it reported.
    const dead = metric(text, "meshwork_db_dead_rows", 'table="tasks"') ?? Number.NaN;
    expect(dead).toBeLessThan(2000);
    expect(metric(text, "meshwork_db_live_rows", 'table="tasks"')).toBeGreaterThanOrEqual(3000);
    // Every task is still there, finished.
    const { tasks } = await h.tasks.listTasks({ pageSize: 10 });
    expect(tasks.length).toBe(10);
  }, 90_000);
});

// Behind a transaction that holds the horizon, on a database of its own
// (no backoff left from another test); PostgreSQL's statistics may take
// seconds to arrive under a loaded CI, hence the longer time.
describe.runIf(onPostgres)("database upkeep, --vacuum on, behind an open transaction", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await createHarness({ vacuum: false });
  });
  afterAll(() => h?.close());

  it("names the open transaction that holds dead rows, and does not vacuum again and again behind it", async () => {
    const begin = async (tx: postgres.ReservedSql) => {
      await tx`begin isolation level repeatable read`;
      await tx`select count(*) from tasks`;
    };
    await whileHeld(h, "report-tool", begin, async (pid) => {
      await churn(h, 3000);
      // The upkeep as the app runs it, with a low threshold, until its first
      // vacuum has run (PostgreSQL's statistics of the churn arrive within
      // seconds): behind the held transaction it removes almost nothing …
      const upkeep = createUpkeep(h.app.database.upkeep, { vacuum: true, minDead: 500 });
      let first: Vacuumed | undefined;
      for (let i = 0; i < 120 && !first?.ran; i++) {
        const reading = await upkeep.read();
        [first] = (await upkeep.vacuumDue(reading)).filter((v) => v.table === "tasks");
        if (!first?.ran) await new Promise((r) => setTimeout(r, 500));
      }
      expect(first).toMatchObject({ ran: true });
      expect(first?.removed ?? 0).toBeLessThan(1000);
      // … and the next passes wait instead of reading the whole table again.
      for (let i = 0; i < 3; i++) {
        const again = await upkeep.vacuumDue(await upkeep.read());
        expect(again.filter((v) => v.table === "tasks")).toEqual([]);
      }
      await h.app.runUpkeep();
      const text = await h.app.metrics.scrape();
      expect(metric(text, "meshwork_db_oldest_transaction_seconds")).toBeGreaterThan(0);
      // What its warning names: the holder's session, never its statement.
      const oldest = await oldestOnceHeldBy(upkeep, pid);
      expect(oldest).toMatchObject({
        pid,
        application: "report-tool",
        state: "idle in transaction",
      });
      expect(Object.keys(oldest ?? {}).sort()).toEqual(["application", "pid", "seconds", "state"]);
    });
  }, 90_000);
});

describe.runIf(onPostgres)("database upkeep, the oldest transaction", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await createHarness({ vacuum: false });
  });
  afterAll(() => h?.close());

  it("names a transaction that wrote and was left idle at READ COMMITTED (no snapshot, an xid)", async () => {
    const upkeep = createUpkeep(h.app.database.upkeep, { vacuum: false });
    let held = 0;
    // Any write gives the transaction an id, which holds every row dead since.
    const begin = async (tx: postgres.ReservedSql) => {
      await tx`begin`;
      await tx`select txid_current()`;
    };
    await whileHeld(h, "forgotten-begin", begin, async (pid) => {
      held = pid;
      expect(await oldestOnceHeldBy(upkeep, pid)).toMatchObject({
        pid,
        application: "forgotten-begin",
        state: "idle in transaction",
      });
    });
    expect((await upkeep.read()).oldest?.pid).not.toBe(held);
  });
});

describe("database upkeep, --vacuum off", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await createHarness({ vacuum: false });
  });
  afterAll(() => h?.close());

  it("reports the dead rows and runs no vacuum", async () => {
    await churn(h, 2500);
    const text = await upkeepUntil(
      h,
      (m) => (metric(m, "meshwork_db_dead_rows", 'table="tasks"') ?? 0) >= 5000,
    );
    expect(metric(text, "meshwork_db_vacuums_total", 'table="tasks"')).toBeUndefined();
  }, 90_000);
});

// The upkeep runs every 10 s on a timer, and stopping does not wait for a
// run under way: closing the database ends it. Its statements then fail
// (postgres.js: CONNECTION_ENDED, or CONNECTION_DESTROYED once its wait
// is over), which is not a fault to report.
describe("database upkeep on its timer", () => {
  const dialect = new PgDialect();
  const connectionEnded = () =>
    Object.assign(new Error("write CONNECTION_ENDED"), { code: "CONNECTION_ENDED" });
  afterEach(() => {
    vi.useRealTimers();
    vi.restoreAllMocks();
  });
  /**
   * An app with its log lines kept, whose upkeep's statement `held` waits
   * until `fail()` makes it throw as a closed connection does: its first
   * reading of the tables' figures, or the first vacuum of two tables
   * that reading says are full of dead rows. `vacuums()`: how many
   * VACUUMs the upkeep began.
   */
  async function appWithHeldUpkeep(held: "reading" | "vacuum") {
    const log = textSink();
    const db = await createTestDatabase();
    const upkeepDb = db.database.upkeep;
    let fail: () => void = () => {};
    const failed = new Promise<void>((resolve) => {
      fail = resolve;
    });
    let reached = false;
    let vacuums = 0;
    // On PGlite the upkeep's handle is the database's only one: only the
    // upkeep's own statements are changed.
    const original = upkeepDb.execute.bind(upkeepDb);
    vi.spyOn(upkeepDb, "execute").mockImplementation(((query: SQL) => {
      const text = dialect.sqlToQuery(query).sql;
      const reading = text.includes("FROM pg_stat_user_tables") && text.includes("n_live_tup");
      if (text.startsWith("VACUUM")) vacuums++;
      if (held === "vacuum" && reading) {
        return Promise.resolve({
          rows: [
            { table: "tasks", live: 0, dead: 1_000_000, vacuums: 0 },
            { table: "task_events", live: 0, dead: 1_000_000, vacuums: 0 },
          ],
        });
      }
      if (held === "reading" ? reading : text.startsWith("VACUUM")) {
        reached = true;
        return failed.then(() => {
          throw connectionEnded();
        });
      }
      return original(query);
    }) as never);
    // Only the intervals are the test's: the upkeep's timer among them.
    vi.useFakeTimers({ toFake: ["setInterval", "clearInterval"] });
    const app = createApp(
      db.database,
      testConfig({ vacuum: true }),
      pino({ level: "info" }, log.stream),
    );
    try {
      await app.start();
    } catch (error) {
      await app.stop();
      await db.drop();
      throw error;
    }
    return {
      app,
      /** Runs the timer's next upkeep, until its held statement waits. */
      async tick() {
        vi.advanceTimersByTime(10_000);
        await vi.waitFor(() => expect(reached).toBe(true), { timeout: 10_000 });
      },
      fail,
      logged: log.text,
      vacuums: () => vacuums,
      async close() {
        vi.restoreAllMocks();
        try {
          await app.stop();
        } finally {
          vi.useRealTimers();
          await db.drop();
        }
      },
    };
  }

  it("reports a run or a vacuum that fails while the coordinator serves", async () => {
    for (const [held, said] of [
      ["reading", "database upkeep failed"],
      ["vacuum", "vacuum failed; tried again later"],
    ] as const) {
      const t = await appWithHeldUpkeep(held);
      try {
        await t.tick();
        t.fail();
        await vi.waitFor(() => expect(t.logged()).toContain(said));
        // Serving, the next due table is vacuumed after a failed one.
        if (held === "vacuum") await vi.waitFor(() => expect(t.vacuums()).toBe(2));
      } finally {
        await t.close();
      }
    }
  }, 60_000);

  it("says nothing of a run or a vacuum that stopping ended, and begins no other vacuum", async () => {
    for (const held of ["reading", "vacuum"] as const) {
      const t = await appWithHeldUpkeep(held);
      try {
        await t.tick();
        // The run under way (runUpkeep answers with it).
        const running = t.app.runUpkeep().catch((error: unknown) => error);
        await t.app.stop();
        t.fail();
        await running;
        expect(t.logged()).not.toContain("database upkeep failed");
        expect(t.logged()).not.toContain("vacuum failed");
        expect(t.vacuums()).toBe(held === "vacuum" ? 1 : 0);
      } finally {
        await t.close();
      }
    }
  }, 60_000);
});
