import { sql } from "drizzle-orm";
import type { Db } from "./database.js";
import { asNumber, rowsOf } from "./values.js";

// A queue's tables churn: every claim and completion leaves a dead version
// of a task row, and of its entries in the claim and lease indexes. Until a
// vacuum removes them, every claim walks past them (the head of
// tasks_claim_idx, a worker's entries in tasks_lease_worker_idx). Where
// autovacuum is off, or behind a burst, or on the embedded database (PGlite
// runs no autovacuum), the coordinator vacuums its own tables; and it
// watches for what no vacuum can fix: an open transaction old enough to
// hold every dead row since it began (the "xmin horizon").

/** A table's rows as PostgreSQL's statistics count them. */
export interface TableRows {
  table: string;
  live: number;
  dead: number;
}

/** The oldest transaction of this database that holds dead rows from being removed. */
export interface HorizonHolder {
  pid: number;
  application: string;
  state: string;
  seconds: number;
}

export interface UpkeepReading {
  tables: TableRows[];
  oldest: HorizonHolder | undefined;
}

export interface UpkeepOptions {
  /** Whether to vacuum (`--vacuum on`); off: watch and report only. */
  vacuum: boolean;
  /** A table is vacuumed once it has this many dead rows … (default 2,000) */
  minDead?: number;
  /** … plus this fraction of its live rows (default 0.05). */
  deadFraction?: number;
  now?: () => number;
}

/** After a vacuum that left most dead rows (the horizon held), the next waits this long at first … */
const backoffStartMs = 10_000;
/** … doubling up to this. */
const backoffMaxMs = 300_000;

/**
 * Reads the live and dead rows of this schema's tables and the oldest
 * transaction holding the horizon, and vacuums (`VACUUM (SKIP_LOCKED)`,
 * no ANALYZE) each table whose dead rows pass the threshold. A vacuum that
 * removed less than half of them (a transaction holds them) is not tried
 * again on that table for a while, doubling: each vacuum reads the whole
 * table. Replicas may run this side by side: SKIP_LOCKED makes a vacuum
 * a table is already under a no-op.
 *
 * `db` must run statements outside a transaction and without a statement
 * timeout: the database's `upkeep` handle.
 */
export function createUpkeep(db: Db, options: UpkeepOptions) {
  const minDead = options.minDead ?? 2000;
  const deadFraction = options.deadFraction ?? 0.05;
  const now = options.now ?? Date.now;
  /** Per table: not before when, and the wait after the next failed try. */
  const backoff = new Map<string, { until: number; nextMs: number }>();

  async function read(): Promise<UpkeepReading> {
    const tables = await rowsOf<{ table: string; live: unknown; dead: unknown }>(
      db,
      sql`SELECT relname AS "table", n_live_tup AS live, n_dead_tup AS dead
        FROM pg_stat_user_tables WHERE schemaname = current_schema()
        ORDER BY n_dead_tup DESC, relname`,
    );
    // Client backends of this database with a snapshot, ours excepted, and
    // not a vacuum (which holds nobody's rows). The statement's text is
    // never read out.
    const [oldest] = await rowsOf<{
      pid: unknown;
      application: string | null;
      state: string | null;
      seconds: unknown;
    }>(
      db,
      sql`SELECT pid, application_name AS application, state,
          extract(epoch FROM now() - xact_start)::float8 AS seconds
        FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()
          AND backend_type = 'client backend' AND backend_xmin IS NOT NULL
          AND xact_start IS NOT NULL AND query NOT ILIKE 'vacuum%'
        ORDER BY age(backend_xmin) DESC, xact_start LIMIT 1`,
    );
    return {
      tables: tables.map((t) => ({
        table: t.table,
        live: asNumber(t.live),
        dead: asNumber(t.dead),
      })),
      oldest: oldest && {
        pid: asNumber(oldest.pid),
        application: oldest.application ?? "",
        state: oldest.state ?? "",
        seconds: Math.max(0, asNumber(oldest.seconds)),
      },
    };
  }

  /** Whether `t` has enough dead rows to vacuum now. */
  function due(t: TableRows): boolean {
    if (t.dead < minDead + deadFraction * t.live) return false;
    const b = backoff.get(t.table);
    return !b || now() >= b.until;
  }

  async function vacuum(t: TableRows): Promise<{ table: string; removed: number }> {
    await db.execute(sql`VACUUM (SKIP_LOCKED) ${sql.identifier(t.table)}`);
    const [after] = await rowsOf<{ dead: unknown }>(
      db,
      sql`SELECT n_dead_tup AS dead FROM pg_stat_user_tables
        WHERE schemaname = current_schema() AND relname = ${t.table}`,
    );
    const left = asNumber(after?.dead);
    if (left * 2 > t.dead) {
      const nextMs = backoff.get(t.table)?.nextMs ?? backoffStartMs;
      backoff.set(t.table, { until: now() + nextMs, nextMs: Math.min(2 * nextMs, backoffMaxMs) });
    } else {
      backoff.delete(t.table);
    }
    return { table: t.table, removed: Math.max(0, t.dead - left) };
  }

  return {
    read,
    /** Reads, then vacuums the tables that are due, one after the other. */
    async run(): Promise<UpkeepReading & { vacuumed: { table: string; removed: number }[] }> {
      const reading = await read();
      const vacuumed = [];
      if (options.vacuum) {
        for (const t of reading.tables.filter(due)) {
          const v = await vacuum(t);
          vacuumed.push(v);
          // The figures say what the vacuum left.
          t.dead -= v.removed;
        }
      }
      return { ...reading, vacuumed };
    },
  };
}

export type Upkeep = ReturnType<typeof createUpkeep>;
