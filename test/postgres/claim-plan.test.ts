import type postgres from "postgres";
import { beforeAll, describe, expect, it } from "vitest";
import { sharesWithPendingText } from "../../src/scheduling/store.js";
import { createTaskStore } from "../../src/tasks/store.js";
import { onPostgres } from "../support/database.js";
import { newTask } from "../support/fixtures.js";
import { explainEverything, planDatabase } from "../support/plans.js";

// The claim's plan decisions (src/leases/sql/claim.sql and grant.sql) are
// what keep a claim O(claimed) whatever the backlog: the PENDING scan walks
// tasks_ready_idx in claim order and stops when the claim is full, and the
// UPDATE reaches the picked rows by primary key. This checks the plans PostgreSQL actually runs (through
// auto_explain, which logs the statements inside the function), before and
// after ANALYZE: this machine's PostgreSQL runs with autovacuum off, and a
// plan that is right only with fresh statistics is wrong after every burst.
describe.skipIf(!onPostgres)("the claim's plan on PostgreSQL", () => {
  const plans: string[] = [];
  const db = planDatabase(plans);
  const worker = "a0000000-0000-4000-8000-00000000000a";

  beforeAll(async () => {
    await db.sql`insert into workers (id, capabilities, max_concurrency) values (${worker}, '{w}', 1000)`;
    await db.sql`insert into tasks (id, workload, state, max_attempts, lease_seconds,
        backoff_initial_ms, backoff_max_ms, backoff_multiplier)
      select gen_random_uuid(), case when i % 10 = 0 then 'w' else 'other' end, 'PENDING',
        3, 60, 1000, 300000, 2
      from generate_series(1, 20000) as i`;
    await explainEverything(db.sql, { nested: true });
  });

  /** The plans of one claim: its sources' scans and the grant it calls (grant.sql). */
  async function claimPlan(): Promise<string> {
    plans.length = 0;
    const rows = await db.sql`select id from meshwork_claim(${worker}, '{w}', '{}', 10, null)`;
    expect(rows).toHaveLength(10);
    return plans.join("\n");
  }

  for (const analyzed of [false, true]) {
    it(`walks the claim index and updates by primary key ${analyzed ? "after" : "without"} ANALYZE`, async () => {
      if (analyzed) await db.sql`analyze tasks`;
      const plan = await claimPlan();
      expect(plan).toContain("Index Scan using tasks_ready_idx");
      expect(plan).toMatch(/Update on tasks[\s\S]*Index Scan using tasks_pkey/);
      expect(plan).not.toContain("Bitmap");
      expect(plan).not.toMatch(/Seq Scan on tasks/);
      expect(plan).not.toContain("JIT:");
    });
  }
});

// A claim with a plan from the share book reads each share of the plan
// through tasks_share_claim_idx: only that share's tasks, whatever the
// backlog of the others and whether the table was analysed.
describe.skipIf(!onPostgres)("the claim's plan of shares on PostgreSQL", () => {
  const plans: string[] = [];
  const db = planDatabase(plans);
  const worker = "d0000000-0000-4000-8000-00000000000d";

  beforeAll(async () => {
    await db.sql`insert into workers (id, capabilities, max_concurrency, capacity)
      values (${worker}, '{w}', 1000, '{"cpu": 1000}')`;
    // 20,000 tasks in 1,000 shares, made as CreateTasks makes them (1,000 a
    // statement, a batch's tasks with one created_at): the planner, without
    // statistics, found tasks_ready_idx (its entries deduplicated, small) as
    // cheap as the share's own index, and took it.
    const store = createTaskStore(db.tdb.database.db);
    for (let batch = 0; batch < 20; batch++) {
      await store.create(
        Array.from({ length: 1000 }, (_, i) =>
          newTask({ workload: "w", share: `team-${i}`, resources: { cpu: 1, slots: 1 } }),
        ),
      );
    }
    await explainEverything(db.sql, { nested: true, analyze: true, timing: false });
  });

  for (const analyzed of [false, true]) {
    it(`takes each share of a plan through its own index ${analyzed ? "after" : "without"} ANALYZE, planned afresh and generic`, async () => {
      if (analyzed) await db.sql`analyze tasks`;
      // plpgsql plans the share's scan afresh (the share a value) for its
      // first runs, then may keep a generic plan (the share a parameter):
      // the last four claims are made with the generic one.
      for (let i = 0; i < 8; i++) {
        const generic = i >= 4;
        if (i === 4) await db.sql`set plan_cache_mode = force_generic_plan`;
        const share = `team-${analyzed ? 500 + i : i}`;
        plans.length = 0;
        const plan = { shares: [share], seq: [0, 0, 0, 0, 0] };
        const rows = await db.sql`select share from meshwork_claim(${worker}, '{w}', '{}', 5, null,
          ${db.sql.json(plan)})`;
        expect(rows.map((r) => r.share)).toEqual(Array(5).fill(share));
        const explained = plans.join("\n");
        const scan =
          /Index Scan using tasks_share_claim_idx[^\n]*\n\s*Index Cond: \(+share >?= ([^)]*)\)/.exec(
            explained,
          );
        expect(scan?.[1]).toEqual(generic ? expect.stringMatching(/^\$\d+$/) : `'${share}'::text`);
        // No scan read and dropped the other shares' tasks.
        expect(explained).not.toMatch(/Rows Removed by Filter: \d{3,}/);
      }
      await db.sql`reset plan_cache_mode`;
    });
  }
});

// Tasks waiting for a dependency are not in the claim's walk: a claim
// behind a large graph still reads only what it takes.
describe.skipIf(!onPostgres)("the claim behind tasks waiting for a dependency", () => {
  const plans: string[] = [];
  const db = planDatabase(plans);
  const worker = "c0000000-0000-4000-8000-00000000000c";

  beforeAll(async () => {
    await db.sql`insert into workers (id, capabilities, max_concurrency) values (${worker}, '{w}', 1000)`;
    // 20,000 waiting tasks first (the oldest, so at the head of the claim
    // order), then 10 that may run.
    await db.sql`insert into tasks (id, workload, state, max_attempts, lease_seconds,
        backoff_initial_ms, backoff_max_ms, backoff_multiplier, dependencies_pending,
        not_before, created_at)
      select gen_random_uuid(), 'w', 'PENDING', 3, 60, 1000, 300000, 2, 1, 'infinity',
        now() - interval '1 hour'
      from generate_series(1, 20000)`;
    await db.sql`insert into tasks (id, workload, state, max_attempts, lease_seconds,
        backoff_initial_ms, backoff_max_ms, backoff_multiplier)
      select gen_random_uuid(), 'w', 'PENDING', 3, 60, 1000, 300000, 2
      from generate_series(1, 10)`;
    await explainEverything(db.sql, { nested: true, analyze: true, timing: false });
  });

  it("takes the 10 tasks that may run without stepping over the 20,000 that wait", async () => {
    plans.length = 0;
    const rows =
      await db.sql`select id, dependencies_pending from meshwork_claim(${worker}, '{w}', '{}', 10, null)`;
    expect(rows).toHaveLength(10);
    expect(rows.every((r) => r.dependencies_pending === 0)).toBe(true);
    const plan = plans.join("\n");
    expect(plan).toContain("Index Scan using tasks_ready_idx");
    // No scan of the claim read and dropped the waiting tasks.
    expect(plan).not.toMatch(/Rows Removed by Filter: \d{3,}/);
  });
});

// The trap the first test cannot see: a connection that claimed while the
// table was small keeps the plans it made then (plpgsql caches a generic plan
// after a few runs). A claim must still reach its rows by index once the
// table has grown, unanalyzed, to a large backlog on that same connection.
describe.skipIf(!onPostgres)("the claim's plan on a connection that began on a small table", () => {
  const plans: string[] = [];
  const db = planDatabase(plans);
  const worker = "b0000000-0000-4000-8000-00000000000b";
  const insert = (n: number) => db.sql`insert into tasks (id, workload, state, max_attempts,
      lease_seconds, backoff_initial_ms, backoff_max_ms, backoff_multiplier)
    select gen_random_uuid(), 'w', 'PENDING', 3, 60, 1000, 300000, 2
    from generate_series(1, ${n}::int)`;

  beforeAll(async () => {
    await db.sql`insert into workers (id, capabilities, max_concurrency) values (${worker}, '{w}', 100000)`;
  });

  it("reads the picked rows by primary key after the table grew from a handful of rows to 60,000", async () => {
    await insert(40);
    // Enough claims for plpgsql to settle on a generic plan for a tiny table.
    for (let i = 0; i < 8; i++) {
      const rows = await db.sql`select id from meshwork_claim(${worker}, '{w}', '{}', 2, null)`;
      expect(rows).toHaveLength(2);
    }
    await insert(60_000);
    await explainEverything(db.sql, { nested: true, analyze: true });
    plans.length = 0;
    const rows = await db.sql`select id from meshwork_claim(${worker}, '{w}', '{}', 10, null)`;
    expect(rows).toHaveLength(10);
    const plan = plans.join("\n");
    expect(plan).toMatch(/Update on tasks[\s\S]*Index Scan using tasks_pkey/);
    expect(plan).not.toMatch(/Seq Scan on tasks/);
    // Rows read: the claim's own, not the table's.
    const removed = [...plan.matchAll(/Rows Removed by Filter: (\d+)/g)].map((m) => Number(m[1]));
    expect(Math.max(0, ...removed)).toBeLessThan(1000);
  });
});

// The counts a claim makes of a worker's leases (and of a concurrency
// key's) are plpgsql functions, whose plans a connection keeps: whoever
// calls them first, while the table is small, they must still count by
// index once it has grown, unanalyzed (scheduling/sql/resources.sql).
describe.skipIf(!onPostgres)(
  "a worker's lease counts on a connection that began on a small table",
  () => {
    const plans: string[] = [];
    const db = planDatabase(plans);
    const worker = "c0000000-0000-4000-8000-00000000000c";
    const leased = (
      n: number,
      to: string | null,
      key: string,
    ) => db.sql`insert into tasks (id, workload,
      state, attempt, max_attempts, lease_seconds, backoff_initial_ms, backoff_max_ms,
      backoff_multiplier, lease_worker_id, lease_expires_at, concurrency_key)
    select gen_random_uuid(), 'w', 'RUNNING', 1, 3, 60, 1000, 300000, 2,
      coalesce(${to}::uuid, gen_random_uuid()), now() + interval '1 hour', ${key}
    from generate_series(1, ${n}::int)`;
    const counts = () => db.sql`select meshwork_slots_held(${worker}) as slots,
      meshwork_allocated(${worker}) as allocated, meshwork_live_leases(${worker}) as live,
      meshwork_key_running('k') as running`;

    beforeAll(async () => {
      await db.sql`insert into workers (id, capabilities, max_concurrency) values (${worker}, '{w}', 100)`;
      // An ANALYZE between the growth and the check would replan and hide a kept plan.
      await db.sql`alter table tasks set (autovacuum_enabled = off)`;
    });

    it("counts by index after the table grew from a handful of rows to 60,000", async () => {
      await leased(40, worker, "k");
      // Statistics that say the table is small (a fresh table is assumed 10 pages).
      await db.sql`vacuum analyze tasks`;
      // Called outside any claim, enough times for plpgsql to keep a generic plan.
      for (let i = 0; i < 8; i++) await counts();
      await leased(60_000, null, "other");
      await explainEverything(db.sql, { nested: true, analyze: true });
      plans.length = 0;
      const [row] = await counts();
      expect(row).toEqual({ slots: "40", allocated: { slots: 40 }, live: 40, running: 40 });
      const plan = plans.join("\n");
      expect(plan).toContain("tasks_lease_worker_expiry_idx");
      expect(plan).not.toMatch(/Seq Scan on tasks/);
      const removed = [...plan.matchAll(/Rows Removed by Filter: (\d+)/g)].map((m) => Number(m[1]));
      expect(Math.max(0, ...removed)).toBeLessThan(1000);
    });
  },
);

// While a transaction is held open nothing can be vacuumed: every lease
// granted since, completed or not, leaves an entry in the lease indexes
// that a vacuum would have removed. A claim reads neither those of leases
// that expired before the sweeper's last pass (claim.sql, expired_from) nor
// a worker's leases that ran out (tasks_lease_worker_expiry_idx).
describe.skipIf(!onPostgres)("the claim behind a transaction held open", () => {
  const db = planDatabase();
  let holder: postgres.Sql;
  const worker = "d0000000-0000-4000-8000-00000000000d";
  const other = "e0000000-0000-4000-8000-00000000000e";

  beforeAll(async () => {
    holder = db.client();
    await db.sql`insert into workers (id, capabilities, max_concurrency) values
      (${worker}, '{w}', 100), (${other}, '{w}', 100)`;
    await holder`begin isolation level repeatable read`;
    await holder`select count(*) from workers`;
    // 3,000 leases of the worker, expired 10 to 5 minutes ago, then
    // finished: dead versions the held snapshot keeps in both lease indexes.
    await db.sql`insert into tasks (id, workload, state, attempt, max_attempts, lease_seconds,
        backoff_initial_ms, backoff_max_ms, backoff_multiplier, lease_worker_id, lease_expires_at)
      select gen_random_uuid(), 'gone', 'RUNNING', 1, 3, 60, 1000, 300000, 2, ${worker},
        now() - interval '10 minutes' + i * interval '100 milliseconds'
      from generate_series(1, 3000) as i`;
    await db.sql`update tasks set state = 'SUCCEEDED', finished_at = now(), lease_expires_at = null
      where workload = 'gone'`;
    // 3,000 tasks claimed and finished: dead entries at the head of the claim order.
    await db.sql`insert into tasks (id, workload, state, max_attempts, lease_seconds,
        backoff_initial_ms, backoff_max_ms, backoff_multiplier, created_at)
      select gen_random_uuid(), 'w', 'PENDING', 3, 60, 1000, 300000, 2,
        now() - interval '1 day' + i * interval '1 millisecond'
      from generate_series(1, 3000) as i`;
    await db.sql`update tasks set state = 'SUCCEEDED', finished_at = now()
      where workload = 'w' and state = 'PENDING'`;
    // Ten tasks to claim, and one lease of another worker that expired a second ago.
    await db.sql`insert into tasks (id, workload, state, max_attempts, lease_seconds,
        backoff_initial_ms, backoff_max_ms, backoff_multiplier)
      select gen_random_uuid(), 'w', 'PENDING', 3, 60, 1000, 300000, 2
      from generate_series(1, 10)`;
    await db.sql`insert into tasks (id, workload, state, attempt, max_attempts, lease_seconds,
        backoff_initial_ms, backoff_max_ms, backoff_multiplier, lease_worker_id, lease_expires_at,
        created_at)
      values ('f0000000-0000-4000-8000-00000000000f', 'w', 'RUNNING', 1, 3, 60, 1000, 300000, 2,
        ${other}, now() - interval '1 second', now() - interval '1 hour')`;
  });

  /**
   * The index entries returned to this session so far, not flushed to the
   * statistics yet (an earlier transaction's may still be in): compare two
   * readings in one transaction.
   */
  const entriesRead = (tx: postgres.TransactionSql) => tx`select
    pg_stat_get_xact_tuples_returned('tasks_lease_expiry_idx'::regclass)::int as expiry,
    pg_stat_get_xact_tuples_returned('tasks_lease_worker_expiry_idx'::regclass)::int as worker,
    pg_stat_get_xact_tuples_returned('tasks_ready_idx'::regclass)::int as ready`;

  const rollBack = new Error("roll back");

  /**
   * Runs `work` in a transaction that is rolled back after it: what it
   * answered, and the index entries it read (entriesRead before and after).
   */
  async function reading<T>(work: (tx: postgres.TransactionSql) => Promise<T>) {
    let result: { value: T; read: { expiry: number; worker: number; ready: number } } | undefined;
    await db.sql
      .begin(async (tx) => {
        const [before] = await entriesRead(tx);
        const value = await work(tx);
        const [after] = await entriesRead(tx);
        const read = (index: "expiry" | "worker" | "ready") =>
          Number(after?.[index]) - Number(before?.[index]);
        result = {
          value,
          read: { expiry: read("expiry"), worker: read("worker"), ready: read("ready") },
        };
        throw rollBack;
      })
      .catch((e: unknown) => {
        if (e !== rollBack) throw e;
      });
    if (!result) throw new Error("the transaction did not run");
    return result;
  }

  /** A claim of 11 in its own transaction (rolled back): the ids it took, and the index entries it read. */
  async function claimReading(expiredFrom: string | null) {
    const { value: ids, read } = await reading(async (tx) => {
      const rows = await tx`select id from meshwork_claim(${worker}, '{w}', '{}', 11, null,
        null, null, ${expiredFrom}::timestamptz)`;
      return rows.map((r) => r.id as string);
    });
    return { ids, read };
  }

  it("reads no entry of a lease that expired before the sweeper's pass, and still takes one that expired a moment ago", async () => {
    const [row] = await db.sql`select (now() - interval '5 seconds')::text as mark`;
    const marked = await claimReading(String(row?.mark));
    expect(marked.ids).toHaveLength(11);
    expect(marked.ids[0]).toBe("f0000000-0000-4000-8000-00000000000f");
    expect(marked.read.expiry).toBeLessThan(100);
    // The worker's slot counts read only its leases expiring after now().
    expect(marked.read.worker).toBeLessThan(100);
    // Without a pass to start from, the claim reads every dead entry.
    const unmarked = await claimReading(null);
    expect(unmarked.ids).toEqual(marked.ids);
    expect(unmarked.read.expiry).toBeGreaterThanOrEqual(3000);
  });

  it("walks the dead entries at the head of the claim order once per batch of claims, not once per claim", async () => {
    const batch = Array.from(
      { length: 8 },
      (_, i) => `d0000000-0000-4000-8000-0000000001${String(i).padStart(2, "0")}`,
    );
    for (const id of batch) {
      await db.sql`insert into workers (id, capabilities, max_concurrency) values (${id}, '{w}', 1)`;
    }
    const claims = batch.map((id) => ({ worker: id, caps: ["w"], labels: {}, max: 1 }));
    const { value: taken, read } = await reading(async (tx) => {
      const rows = await tx`select (b.task).id as id
        from meshwork_claim_batch(${JSON.stringify(claims)}::text::jsonb) as b
        where (b.task).id is not null`;
      return rows.map((r) => r.id as string);
    });
    // One claim took the lease expired a second ago; seven took the oldest PENDING tasks.
    expect(taken).toHaveLength(8);
    expect(new Set(taken).size).toBe(8);
    expect(taken).toContain("f0000000-0000-4000-8000-00000000000f");
    // Once by the batch (3,000 and the live ones), not 8 × 3,000.
    expect(read.ready).toBeGreaterThanOrEqual(3000);
    expect(read.ready).toBeLessThan(2 * 3000);
    // The same for the dead entries of expired leases (no sweeper mark: from the first).
    expect(read.expiry).toBeGreaterThanOrEqual(3000);
    expect(read.expiry).toBeLessThan(2 * 3000);
  });

  it("counts a worker's slots once per claim of a batch: its answer is that count and what the claim took", async () => {
    const busy = "d0000000-0000-4000-8000-0000000002aa";
    await db.sql`insert into workers (id, capabilities, max_concurrency) values (${busy}, '{w}', 100)`;
    // 3,000 leases granted to it in the last minute and finished, one still
    // live: the dead versions sit in its range of live expiries, which each
    // count walks.
    await db.sql`insert into tasks (id, workload, state, attempt, max_attempts, lease_seconds,
        backoff_initial_ms, backoff_max_ms, backoff_multiplier, lease_worker_id, lease_expires_at)
      select gen_random_uuid(), 'done', 'RUNNING', 1, 3, 60, 1000, 300000, 2, ${busy},
        now() + interval '1 minute' - i * interval '10 milliseconds'
      from generate_series(1, 3001) as i`;
    await db.sql`update tasks set state = 'SUCCEEDED', finished_at = now()
      where id in (select id from tasks where workload = 'done' order by lease_expires_at limit 3000)`;
    const claims = [{ worker: busy, caps: ["w"], labels: {}, max: 3 }];
    const { value: answer, read } = await reading(async (tx) => {
      const rows = await tx`select b.claim, b.free, b.cap, (b.task).id as id
        from meshwork_claim_batch(${JSON.stringify(claims)}::text::jsonb) as b
        where b.claim = 0`;
      const counted = rows.find((r) => r.id === null);
      return {
        taken: rows.filter((r) => r.id !== null).length,
        free: counted?.free ?? null,
        cap: counted?.cap ?? null,
      };
    });
    // 100 less the live lease and the three taken.
    expect(answer).toEqual({ taken: 3, free: 96, cap: 100 });
    // One walk of its 3,001 entries, not one before the claim and one after.
    expect(read.worker).toBeGreaterThanOrEqual(3000);
    expect(read.worker).toBeLessThan(2 * 3000);
  });

  it("answers a drained worker's slots without waiting for its row's lock", async () => {
    const drained = "d0000000-0000-4000-8000-0000000002bb";
    await db.sql`insert into workers (id, capabilities, max_concurrency, drained) values (${drained}, '{w}', 4, true)`;
    const locker = db.client();
    try {
      // Its row locked as a heartbeat or a drain toggle locks it, for longer than a batch waits (2 s).
      await locker`begin`;
      await locker`select id from workers where id = ${drained} for no key update`;
      const claims = [{ worker: drained, caps: ["w"], labels: {}, max: 2 }];
      const rows = await db.sql`select b.claim, b.free, b.cap, (b.task).id as id
        from meshwork_claim_batch(${JSON.stringify(claims)}::text::jsonb) as b where b.claim = 0`;
      expect(rows.map((r) => ({ free: r.free, cap: r.cap, id: r.id }))).toEqual([
        { free: 4, cap: 4, id: null },
      ]);
    } finally {
      await locker`rollback`.catch(() => {});
    }
  });

  it("finds the first ready task from the last batch's hint, past the entries of the tasks claimed before", async () => {
    const claims = [{ worker, caps: ["w"], labels: {}, max: 2 }];
    /** A batch of one claim in its own transaction (rolled back): what it took, its hint, the entries it read. */
    async function batch(hint: string | null) {
      const { value, read } = await reading(async (tx) => {
        const rows = await tx`select b.claim, (b.task).id as id, (b.task).progress_message as hint
          from meshwork_claim_batch(${JSON.stringify(claims)}::text::jsonb, ${hint}::text::jsonb) as b`;
        return {
          taken: rows.filter((r) => r.claim === 0 && r.id).map((r) => r.id as string),
          hint: (rows.find((r) => r.claim === -1)?.hint as string | undefined) ?? null,
        };
      });
      return { ...value, read: read.ready };
    }
    const first = await batch(null);
    expect(first.read).toBeGreaterThanOrEqual(3000);
    expect(first.hint).not.toBeNull();
    expect(JSON.parse(first.hint ?? "{}")).toMatchObject({
      priority: 0,
      deadline: null,
      head: true,
    });
    // How long the look from the head took: the caller keeps a hint longer when it is slow.
    expect(JSON.parse(first.hint ?? "{}").headMs).toBeGreaterThan(0);
    const second = await batch(first.hint);
    expect(second.taken).toEqual(first.taken);
    expect(second.read).toBeLessThan(100);
    expect(JSON.parse(second.hint ?? "{}")).toMatchObject({ head: false, headMs: null });
    // Once the ready epoch moves, the hint is not used.
    await db.sql`select nextval('meshwork_ready_epoch')`;
    const third = await batch(first.hint);
    expect(third.taken).toEqual(first.taken);
    expect(third.read).toBeGreaterThanOrEqual(3000);
  });

  it("looks for a task to reserve from the first ready task's key, not from the head", async () => {
    const [head] = await db.sql`select priority, deadline, created_at from tasks
      where state = 'PENDING' and dependencies_pending = 0
      order by priority desc nulls last, deadline asc nulls last, created_at asc limit 1`;
    const { value: taken, read } = await reading(async (tx) => {
      // With reserve_after_ms (0: any large task waiting would do).
      const rows = await tx`select id from meshwork_claim(${worker}, '{w}', '{}', 2, null,
        null, 0, now() - interval '5 seconds', ${head?.priority}, ${head?.deadline}, ${head?.created_at})`;
      return rows.length;
    });
    expect(taken).toBe(2);
    expect(read.ready).toBeLessThan(100);
  });

  it("finds the shares with work without reading the entries of the tasks claimed since", async () => {
    let shares: string[] = [];
    let read = 0;
    await db.sql.begin(async (tx) => {
      const before = await tx`select
        pg_stat_get_xact_tuples_returned('tasks_share_claim_idx'::regclass)::int as n`;
      shares = (await tx.unsafe(sharesWithPendingText)).map((r) => r.share as string);
      const after = await tx`select
        pg_stat_get_xact_tuples_returned('tasks_share_claim_idx'::regclass)::int as n`;
      read = Number(after[0]?.n) - Number(before[0]?.n);
    });
    // The ten live tasks are in the default share, behind the 3,000 claimed.
    expect(shares).toEqual(["default"]);
    expect(read).toBeLessThan(100);
  });
});
