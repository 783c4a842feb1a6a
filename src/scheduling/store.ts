import { and, asc, eq, gt, sql } from "drizzle-orm";
import type { Db } from "../db/database.js";
import { concurrencyLimits, type Resources, rateLimits, shares } from "../db/schema/index.js";
import { asNumber, rowsOf } from "../db/values.js";

/** What live leases hold, per share path: summed resources and a count. */
export interface HeldByShare {
  held: Resources;
  running: number;
}

/** Which keys a listing reads: one `key`, or up to `size` after `after` (all by default). */
export interface KeyRange {
  key?: string | undefined;
  after?: string | undefined;
  size?: number | undefined;
}

/** A key's concurrency limit, with what runs and waits under it. */
export interface LimitRow {
  key: string;
  maxRunning: number;
  running: number;
  pending: number;
}

/** A key's rate, with the tokens its bucket holds now (database clock). */
export interface RateRow {
  key: string;
  perSecond: number;
  burst: number;
  tokens: number;
  refilledAt: Date;
}

/**
 * The share paths with PENDING tasks that wait for no dependency (what a
 * claim could take once due): a skip over tasks_share_claim_idx, one index
 * probe per share, whatever the backlog.
 *
 * The skip goes backwards, from the last share, and each probe lands on the
 * end of a share's range, the last task in its claim order. The entries of
 * the tasks claimed since the last vacuum are at the start of their share's
 * range; while a transaction is held open no vacuum can remove them, and a
 * probe from the start walked every one (test/postgres/claim-plan.test.ts).
 */
export const sharesWithPendingText = `with recursive s(share) as (
    (select t.share from tasks t where t.state = 'PENDING' and t.dependencies_pending = 0
      order by t.share desc limit 1)
    union all
    select (select t.share from tasks t
      where t.state = 'PENDING' and t.dependencies_pending = 0 and t.share < s.share
      order by t.share desc limit 1)
    from s where s.share is not null)
  select share from s where share is not null`;

/**
 * The scheduling tables (shares, share_usage, concurrency_limits,
 * rate_limits) and the reads of tasks and workers that the share book,
 * ListShares, ListLimits and the autoscaler need.
 */
export function createSchedulingStore(db: Db, heartbeatIntervalSeconds: number) {
  return {
    /** What the live (not LOST) workers offer together, `slots` included (one without a limit: none counted). */
    async fleetCapacity(): Promise<Resources> {
      const rows = await rowsOf<{ key: string; total: string | number }>(
        db,
        sql`select e.key, sum(e.value::bigint) as total
          from workers w, jsonb_each_text(meshwork_capacity(w)) as e
          where w.last_heartbeat_at >= now() - make_interval(secs => ${3 * heartbeatIntervalSeconds})
            and not (e.key = 'slots' and w.max_concurrency = 0)
          group by e.key`,
      );
      return Object.fromEntries(rows.map((r) => [r.key, asNumber(r.total)]));
    },

    /** What live leases hold, by share path (one pass over the leased tasks). */
    async heldByShare(): Promise<Map<string, HeldByShare>> {
      const rows = await rowsOf<{
        share: string;
        key: string;
        total: string | number;
        n: string | number;
      }>(
        db,
        sql`select t.share, e.key, sum(e.value::bigint) as total, count(*) as n
          from tasks t, jsonb_each_text(t.resources) as e
          where t.state in ('ASSIGNED', 'RUNNING') and t.lease_expires_at > now()
          group by t.share, e.key`,
      );
      const out = new Map<string, HeldByShare>();
      for (const r of rows) {
        const entry = out.get(r.share) ?? { held: {}, running: 0 };
        entry.held[r.key] = asNumber(r.total);
        // Every task holds slots: its count is the running count.
        if (r.key === "slots") entry.running = asNumber(r.n);
        out.set(r.share, entry);
      }
      return out;
    },

    /** The share paths with PENDING tasks that wait for no dependency (sharesWithPendingText). */
    async sharesWithPending(): Promise<string[]> {
      const rows = await rowsOf<{ share: string }>(db, sql.raw(sharesWithPendingText));
      return rows.map((r) => r.share);
    },

    /** PENDING tasks per share path (ListShares; O(backlog)). */
    async pendingByShare(): Promise<Map<string, number>> {
      const rows = await rowsOf<{ share: string; n: string | number }>(
        db,
        sql`select share, count(*) as n from tasks where state = 'PENDING' group by share`,
      );
      return new Map(rows.map((r) => [r.share, asNumber(r.n)]));
    },

    async weights(): Promise<Map<string, number>> {
      const rows = await db.select().from(shares);
      return new Map(rows.map((r) => [r.path, r.weight]));
    },

    /** Each share's decayed usage, decayed further to now. */
    async usage(halfLifeMs: number): Promise<Map<string, number>> {
      const rows = await rowsOf<{ path: string; usage: number | string }>(
        db,
        sql`select path, usage * power(0.5,
            greatest(0, extract(epoch from now() - updated_at)) * 1000 / ${halfLifeMs}::float8) as usage
          from share_usage`,
      );
      return new Map(rows.map((r) => [r.path, asNumber(r.usage)]));
    },

    /**
     * Moves every share's usage on to now: an average of what its leases
     * held, decayed with `halfLifeMs` since it was last moved, assuming
     * `allocation` (share → dominant share held now) held since then. Any
     * replica may run it, at most once a second per share; rows that
     * decayed to nothing are removed.
     */
    async decayUsage(allocation: Map<string, number>, halfLifeMs: number): Promise<void> {
      const now = JSON.stringify(Object.fromEntries(allocation));
      // A share seen for the first time starts from no usage.
      await db.execute(sql`insert into share_usage (path, usage, updated_at)
        select a.key, 0, now() from jsonb_each_text(${now}::jsonb) as a
        on conflict (path) do update set
          usage = (${now}::jsonb ->> share_usage.path)::float8
            + (share_usage.usage - (${now}::jsonb ->> share_usage.path)::float8) * power(0.5,
            greatest(0, extract(epoch from now() - share_usage.updated_at)) * 1000 / ${halfLifeMs}::float8),
          updated_at = now()
        where share_usage.updated_at < now() - interval '900 milliseconds'`);
      await db.execute(sql`update share_usage set
          usage = usage * power(0.5, greatest(0, extract(epoch from now() - updated_at)) * 1000 / ${halfLifeMs}::float8),
          updated_at = now()
        where updated_at < now() - interval '900 milliseconds'
          and not (${now}::jsonb ? path)`);
      await db.execute(
        sql`delete from share_usage where usage < 1e-6 and not (${now}::jsonb ? path)`,
      );
    },

    async setShare(path: string, weight: number): Promise<void> {
      await db
        .insert(shares)
        .values({ path, weight })
        .onConflictDoUpdate({ target: shares.path, set: { weight } });
    },

    async deleteShare(path: string): Promise<boolean> {
      const rows = await db.delete(shares).where(eq(shares.path, path)).returning();
      return rows.length > 0;
    },

    async setLimit(key: string, maxRunning: number): Promise<void> {
      await db
        .insert(concurrencyLimits)
        .values({ key, maxRunning })
        .onConflictDoUpdate({ target: concurrencyLimits.key, set: { maxRunning } });
    },

    async deleteLimit(key: string): Promise<boolean> {
      const rows = await db
        .delete(concurrencyLimits)
        .where(eq(concurrencyLimits.key, key))
        .returning();
      return rows.length > 0;
    },

    /** The limits, by key, with their live leases and PENDING tasks (all, or one key). */
    /** The limits by key: one `key`, or up to `size` after the key `after`. */
    async limits({ key, after, size }: KeyRange = {}): Promise<LimitRow[]> {
      const rows = await rowsOf<{
        key: string;
        max_running: number;
        running: number | string;
        pending: number | string;
      }>(
        db,
        sql`select l.key, l.max_running, meshwork_key_running(l.key) as running,
            (select count(*) from tasks t where t.state = 'PENDING' and t.concurrency_key = l.key) as pending
          from concurrency_limits l
          where (${key ?? null}::text is null or l.key = ${key ?? null}::text)
            and (${after ?? null}::text is null or l.key > ${after ?? null}::text)
          order by l.key
          limit ${size ?? null}`,
      );
      return rows.map((r) => ({
        key: r.key,
        maxRunning: r.max_running,
        running: asNumber(r.running),
        pending: asNumber(r.pending),
      }));
    },

    /**
     * Sets a key's rate. A new bucket starts full; a changed one keeps the
     * tokens it holds now (at most the new burst).
     */
    async setRate(key: string, perSecond: number, burst: number): Promise<void> {
      await db.execute(sql`insert into rate_limits (key, per_second, burst, tokens, refilled_at)
        values (${key}, ${perSecond}, ${burst}, ${burst}, now())
        on conflict (key) do update set
          tokens = least(excluded.burst, meshwork_rate_tokens(rate_limits)),
          per_second = excluded.per_second, burst = excluded.burst,
          refilled_at = greatest(rate_limits.refilled_at, now())`);
    },

    async deleteRate(key: string): Promise<boolean> {
      const rows = await db.delete(rateLimits).where(eq(rateLimits.key, key)).returning();
      return rows.length > 0;
    },

    /** The rates by key, with the tokens each bucket holds now: one `key`, or up to `size` after `after`. */
    async rates({ key, after, size }: KeyRange = {}): Promise<RateRow[]> {
      const rows = await db
        .select({
          key: rateLimits.key,
          perSecond: rateLimits.perSecond,
          burst: rateLimits.burst,
          tokens: sql<number>`meshwork_rate_tokens(${rateLimits})`.mapWith(asNumber),
          refilledAt: rateLimits.refilledAt,
        })
        .from(rateLimits)
        .where(
          and(
            key === undefined ? undefined : eq(rateLimits.key, key),
            after === undefined ? undefined : gt(rateLimits.key, after),
          ),
        )
        .orderBy(asc(rateLimits.key))
        .limit(size ?? Number.MAX_SAFE_INTEGER);
      return rows;
    },
  };
}

export type SchedulingStore = ReturnType<typeof createSchedulingStore>;
