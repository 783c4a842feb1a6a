import { getTableName, is, sql } from "drizzle-orm";
import { PgTable } from "drizzle-orm/pg-core";
import type { Db } from "./database.js";
import * as schema from "./schema/index.js";
import { asNumber, rowsOf } from "./values.js";

// A queue's tables churn: every claim and completion leaves a dead version
// of a task row, and of its entries in the claim and lease indexes. Until a
// vacuum removes them, every claim walks past them (the head of
// tasks_ready_idx, the expired entries of tasks_lease_expiry_idx). Where
// autovacuum is off, or behind a burst, or on the embedded database (PGlite
// runs no autovacuum), the coordinator vacuums its own tables; and it
// watches for what no vacuum can fix: an open transaction old enough to
// hold every dead row since it began (the "xmin horizon").

/** The coordinator's own tables (db/schema/), those it reads and vacuums: never another application's. */
const ownTables = (Object.values(schema) as unknown[])
  .flatMap((t) => (is(t, PgTable) ? [getTableName(t)] : []))
  .join(",");

/** A table's rows as PostgreSQL's statistics count them. */
export interface TableRows {
  table: string;
  live: number;
  dead: number;
  /** Vacuums of it so far (a vacuum skipped because another ran does not count). */
  vacuums: number;
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
 * Reads the live and dead rows of the coordinator's tables and the oldest
 * transaction holding the horizon, and vacuums (`VACUUM (SKIP_LOCKED,
 * TRUNCATE false)`, no ANALYZE) each table whose dead rows pass the
 * threshold. A vacuum that removed less than half of them (a transaction
 * holds them), or failed, is not tried again on that table for a while,
 * doubling: each vacuum reads the whole table. Replicas may run this side
 * by side: SKIP_LOCKED makes a vacuum a table is already under a no-op.
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
    const tables = await rowsOf<{ table: string; live: unknown; dead: unknown; vacuums: unknown }>(
      db,
      sql`SELECT relname AS "table", n_live_tup AS live, n_dead_tup AS dead,
          vacuum_count + autovacuum_count AS vacuums
        FROM pg_stat_user_tables
        WHERE schemaname = current_schema() AND relname = ANY (string_to_array(${ownTables}, ','))
        ORDER BY n_dead_tup DESC, relname`,
    );
    // Client backends of this database whose snapshot (backend_xmin) or
    // transaction id (backend_xid: a transaction that wrote, even at READ
    // COMMITTED and idle) holds back the rows vacuum may remove, ours
    // excepted, and not a vacuum (which holds nobody's rows). The
    // statement's text is never read out. Replication slots and prepared
    // transactions hold rows back too; they are not named here.
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
          AND backend_type = 'client backend' AND xact_start IS NOT NULL
          AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
          AND query NOT ILIKE 'vacuum%'
        ORDER BY greatest(age(backend_xmin), age(backend_xid)) DESC NULLS LAST, xact_start
        LIMIT 1`,
    );
    return {
      tables: tables.map((t) => ({
        table: t.table,
        live: asNumber(t.live),
        dead: asNumber(t.dead),
        vacuums: asNumber(t.vacuums),
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

  /** Not before another wait, doubling: after a vacuum that removed little, or one that failed. */
  function wait(table: string) {
    const nextMs = backoff.get(table)?.nextMs ?? backoffStartMs;
    backoff.set(table, { until: now() + nextMs, nextMs: Math.min(2 * nextMs, backoffMaxMs) });
  }

  /**
   * Vacuums `t`. TRUNCATE false: giving the table's empty end back to the
   * system would take a lock that stops every claim for a moment. Skipped
   * (`ran` false) when another vacuum holds the table.
   */
  async function vacuum(t: TableRows): Promise<Vacuumed> {
    try {
      await db.execute(sql`VACUUM (SKIP_LOCKED, TRUNCATE false) ${sql.identifier(t.table)}`);
    } catch (error) {
      wait(t.table);
      return { table: t.table, ran: false, removed: 0, error };
    }
    const [after] = await rowsOf<{ dead: unknown; vacuums: unknown }>(
      db,
      sql`SELECT n_dead_tup AS dead, vacuum_count + autovacuum_count AS vacuums
        FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname = ${t.table}`,
    );
    const ran = asNumber(after?.vacuums) > t.vacuums;
    const left = ran ? asNumber(after?.dead) : t.dead;
    if (ran && left * 2 > t.dead) wait(t.table);
    else if (ran) backoff.delete(t.table);
    return { table: t.table, ran, removed: Math.max(0, t.dead - left) };
  }

  return {
    read,
    /**
     * Vacuums the tables of `reading` that are due, one after the other; a
     * failure is returned with its table (the others still run), and that
     * table waits before it is tried again. `reading`'s figures are updated
     * with what each vacuum left. Once `signal` is aborted (the coordinator
     * is stopping), no further table is begun.
     */
    async vacuumDue(reading: UpkeepReading, signal?: AbortSignal): Promise<Vacuumed[]> {
      if (!options.vacuum) return [];
      const done: Vacuumed[] = [];
      for (const t of reading.tables.filter(due)) {
        if (signal?.aborted) break;
        const v = await vacuum(t);
        done.push(v);
        t.dead -= v.removed;
      }
      return done;
    },
  };
}

/** What one vacuum did: whether it ran (not skipped, not failed), the dead rows it removed. */
export interface Vacuumed {
  table: string;
  ran: boolean;
  removed: number;
  error?: unknown;
}

export type Upkeep = ReturnType<typeof createUpkeep>;
