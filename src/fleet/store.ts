import { randomUUID } from "node:crypto";
import {
  and,
  asc,
  desc,
  eq,
  getTableColumns,
  inArray,
  isNull,
  or,
  type SQL,
  sql,
} from "drizzle-orm";
import { type DomainError, notFound as notFoundError, permissionDenied } from "../core/errors.js";
import { byTimeAndId, keysetAfter, type Position, pageOf } from "../core/paging.js";
import { allocatedOf, liveLeases } from "../core/task-sql.js";
import { isUuid } from "../core/validate.js";
import { workerLost } from "../core/worker-sql.js";
import type { Db } from "../db/database.js";
import { lazy } from "../db/lazy.js";
import { type Resources, type WorkerRow, workers } from "../db/schema/index.js";

export interface WorkerInput {
  name: string;
  capabilities: string[];
  labels: Record<string, string>;
  cpuCount: number;
  memoryMb: number;
  apiBaseUrl: string;
  maxConcurrency: number | undefined;
  /** What it offers besides slots (core/scheduling.ts workerCapacity); none: nothing but slots. */
  capacity?: Resources | undefined;
  /** A caller-chosen stable name: registering with it again updates the same worker. */
  peerId?: string | undefined;
  /** Where dispatches are POSTed under apiBaseUrl (fleet/dispatch.ts). */
  dispatchPath?: string | undefined;
  /** Signs dispatches; undefined keeps the one set before (write-only). */
  dispatchSecret?: string | undefined;
  /** The address the registration came from ("" in process), which --dispatch-allow lets dispatches reach. */
  registeredFrom?: string | undefined;
}

/** A worker as read: the row plus what is derived from it by the database clock. */
export interface WorkerView extends WorkerRow {
  lost: boolean;
  activeLeases: number;
  /** What its live leases hold (scheduling/sql/resources.sql meshwork_allocated). */
  allocated: Resources;
}

export interface WorkerFilter {
  capability?: string | undefined;
  labels?: Record<string, string> | undefined;
  lost?: boolean | undefined;
  drained?: boolean | undefined;
}

/** The columns a registration sets. */
function fieldsOf(input: WorkerInput) {
  return {
    name: input.name,
    capabilities: input.capabilities,
    labels: input.labels,
    cpuCount: input.cpuCount,
    memoryMb: input.memoryMb,
    apiBaseUrl: input.apiBaseUrl,
    capacity: input.capacity ?? {},
    ...(input.maxConcurrency !== undefined && { maxConcurrency: input.maxConcurrency }),
    // Kept when a registration does not say (its default is the column's).
    ...(input.dispatchPath !== undefined && { dispatchPath: input.dispatchPath }),
    registeredFrom: input.registeredFrom ?? "",
    ...(input.dispatchSecret !== undefined && { dispatchSecret: input.dispatchSecret }),
    lastHeartbeatAt: sql`now()`,
  };
}

/**
 * The worker has no ASSIGNED or RUNNING task leased to it or placed on it
 * (an expired lease the sweeper has not returned yet included): removing or
 * taking over its row strands nothing.
 */
const holdsNoTask = sql`not exists (select 1 from tasks t
  where (t.lease_worker_id = ${workers.id} or t.assigned_worker_id = ${workers.id})
    and t.state in ('ASSIGNED', 'RUNNING'))`;

/** Worker registry. LOST is derived: no heartbeat for 3 intervals, by the database clock. */
export function createFleetStore(db: Db, heartbeatIntervalSeconds: number) {
  const lost = workerLost(heartbeatIntervalSeconds);
  const view = {
    ...getTableColumns(workers),
    lost,
    activeLeases: liveLeases(workers.id).mapWith(Number),
    allocated: allocatedOf(workers.id),
    // A reservation whose task another worker took stays on the row until
    // this worker's next claim drops it; it is shown only while it holds.
    reservedTaskId: sql<string | null>`case when ${workers.reservedTaskId} is null then null
      else (select t.id from tasks t where t.id = ${workers.reservedTaskId} and t.state = 'PENDING') end`,
  };

  // The row alone, without the counts of its live leases: what claims,
  // renewals and completions ask of a worker (fleet/cache.ts). Each count
  // walks the worker's range of tasks_lease_worker_expiry_idx, and behind
  // a transaction held open that range keeps the entry of every lease the
  // worker held in the last lease_seconds (about 10,000 in a drain of
  // 3,000 tasks/s by 16 workers: 6.8 ms of the database's time per read,
  // 10 % of a core in all).
  const rowById = lazy(() =>
    db
      .select()
      .from(workers)
      .where(sql`${workers.id} = ${sql.placeholder("id")}::uuid`)
      .prepare("meshwork_worker_row_by_id"),
  );

  // Prepared once: a worker's reads (GetWorker, its heartbeats' answers) ask it.
  const byId = lazy(() =>
    db
      .select(view)
      .from(workers)
      .where(sql`${workers.id} = ${sql.placeholder("id")}::uuid`)
      .prepare("meshwork_worker_by_id"),
  );

  async function read(where: SQL | undefined): Promise<WorkerView[]> {
    return db.select(view).from(workers).where(where);
  }

  return {
    /**
     * Registers a new worker (owned by the token that registered it), or
     * updates the one named by `id`, or by `input.peerId` (registerPeer).
     */
    async register(
      input: WorkerInput,
      id?: string,
      ownerTokenId: string | null = null,
      options: { mayUpdateAny: boolean } = { mayUpdateAny: true },
    ): Promise<WorkerView> {
      const fields = fieldsOf(input);
      if (id === undefined && input.peerId !== undefined) {
        return this.registerPeer(input.peerId, input, ownerTokenId, options);
      }
      if (id === undefined) {
        const reused = await this.reuseLost(input, ownerTokenId);
        if (reused) return reused;
        const newId = randomUUID();
        await db.insert(workers).values({ id: newId, ownerTokenId, ...fields });
        return this.get(newId);
      }
      const updated = await db
        .update(workers)
        .set(fields)
        .where(eq(workers.id, id))
        .returning({ id: workers.id });
      if (updated.length === 0) throw notFound(id);
      return this.get(id);
    },

    /**
     * Registers the worker named `peerId`, or updates it: one statement, so
     * two registrations racing with one peer id make one worker. Unless
     * `mayUpdateAny`, only the token that registered it may update it.
     */
    async registerPeer(
      peerId: string,
      input: WorkerInput,
      ownerTokenId: string | null,
      options: { mayUpdateAny: boolean },
    ): Promise<WorkerView> {
      const fields = fieldsOf(input);
      const [row] = await db
        .insert(workers)
        .values({ id: randomUUID(), peerId, ownerTokenId, ...fields })
        .onConflictDoUpdate({
          target: workers.peerId,
          set: fields,
          ...(!options.mayUpdateAny && {
            setWhere: sql`${workers.ownerTokenId} is not distinct from ${ownerTokenId}::uuid`,
          }),
        })
        .returning({ id: workers.id });
      if (!row) {
        throw permissionDenied(
          `worker ${JSON.stringify(peerId)} was registered with another token`,
          "FOREIGN_WORKER_TOKEN",
        );
      }
      return this.get(row.id);
    },

    /**
     * The worker named by `peer`: its peer_id, or, for a worker registered
     * without one, its worker_id.
     */
    async getByPeer(peer: string): Promise<WorkerView> {
      const byPeer = eq(workers.peerId, peer);
      const [row] = await db
        .select(view)
        .from(workers)
        .where(
          isUuid(peer)
            ? or(byPeer, and(isNull(workers.peerId), eq(workers.id, peer.toLowerCase())))
            : byPeer,
        )
        .orderBy(sql`${workers.peerId} is null`)
        .limit(1);
      if (!row) throw notFoundError(`worker ${JSON.stringify(peer)}`);
      return row;
    },

    async get(id: string): Promise<WorkerView> {
      const [row] = await byId().execute({ id });
      if (!row) throw notFound(id);
      return row;
    },

    /** The worker's row, without what is counted from its leases (`get` has those). */
    async row(id: string): Promise<WorkerRow> {
      const [row] = await rowById().execute({ id });
      if (!row) throw notFound(id);
      return row;
    },

    /** One page, oldest registration first. */
    async list(
      filter: WorkerFilter,
      size: number,
      after: Position | undefined,
    ): Promise<{ rows: WorkerView[]; next: string }> {
      const rows = await db
        .select(view)
        .from(workers)
        .where(
          and(
            filter.capability
              ? sql`${filter.capability}::text = any(${workers.capabilities})`
              : undefined,
            filter.labels && Object.keys(filter.labels).length > 0
              ? sql`${workers.labels} @> ${JSON.stringify(filter.labels)}::jsonb`
              : undefined,
            filter.lost === undefined ? undefined : filter.lost ? lost : sql`not ${lost}`,
            filter.drained === undefined ? undefined : eq(workers.drained, filter.drained),
            keysetAfter([workers.registeredAt, workers.id], after, "asc"),
          ),
        )
        .orderBy(asc(workers.registeredAt), asc(workers.id))
        .limit(size + 1);
      return pageOf(rows, size, (r) => byTimeAndId(r.registeredAt, r.id));
    },

    /** Records a heartbeat now; returns whether the worker is drained. */
    async heartbeat(id: string, queueDepth: number | undefined): Promise<{ drained: boolean }> {
      const [row] = await db
        .update(workers)
        .set({
          lastHeartbeatAt: sql`now()`,
          ...(queueDepth !== undefined && { queueDepth }),
        })
        .where(eq(workers.id, id))
        .returning({ drained: workers.drained });
      if (!row) throw notFound(id);
      return row;
    },

    /**
     * Records heartbeats of many workers in one statement (the calls workers
     * made for themselves since the last flush).
     */
    async heartbeatMany(beats: Map<string, number | undefined>): Promise<void> {
      if (beats.size === 0) return;
      const json = JSON.stringify([...beats].map(([id, depth]) => ({ id, depth: depth ?? null })));
      // The rows are locked in id order, the order a batch of claims takes
      // them in (leases/claim.ts): two statements that lock several workers
      // in one order cannot deadlock each other.
      await db
        .update(workers)
        .set({
          lastHeartbeatAt: sql`now()`,
          queueDepth: sql`coalesce(v.depth, ${workers.queueDepth})`,
        })
        .from(
          sql`(select w.id, b.depth from workers w
            join jsonb_to_recordset(${json}::jsonb) as b(id uuid, depth int) on b.id = w.id
            order by w.id for no key update of w) as v`,
        )
        .where(sql`${workers.id} = v.id`);
    },

    async drain(id: string, drained: boolean): Promise<WorkerView> {
      const updated = await db
        .update(workers)
        .set({ drained })
        .where(eq(workers.id, id))
        .returning({ id: workers.id });
      if (updated.length === 0) throw notFound(id);
      return this.get(id);
    },

    /**
     * A worker registered without worker_id or peer_id takes the row of the
     * same worker restarted: a LOST worker with the same non-empty name, the
     * same capabilities, the same owner token, no peer id and no live lease
     * (the most recently seen of them). A live worker of that name is never
     * taken: two processes under one name stay two workers. Two restarts at
     * once take one row between them (the other gets a new one).
     */
    async reuseLost(
      input: WorkerInput,
      ownerTokenId: string | null,
    ): Promise<WorkerView | undefined> {
      if (input.name === "") return undefined;
      const caps = `{${[...new Set(input.capabilities)].map((c) => JSON.stringify(c)).join(",")}}`;
      const restarted = db
        .select({ id: workers.id })
        .from(workers)
        .where(
          and(
            isNull(workers.peerId),
            eq(workers.name, input.name),
            sql`${workers.capabilities} @> ${caps}::text[] and ${workers.capabilities} <@ ${caps}::text[]`,
            ownerTokenId === null
              ? isNull(workers.ownerTokenId)
              : eq(workers.ownerTokenId, ownerTokenId),
            lost,
            holdsNoTask,
          ),
        )
        .orderBy(desc(workers.lastHeartbeatAt))
        .limit(1)
        .for("update", { skipLocked: true });
      const [row] = await db
        .update(workers)
        .set(fieldsOf(input))
        .where(inArray(workers.id, restarted))
        .returning({ id: workers.id });
      return row ? this.get(row.id) : undefined;
    },

    /**
     * Removes workers LOST for at least `lostForSeconds` (no heartbeat for
     * that long, and never less than the 3 intervals that make a worker
     * LOST) that hold no live lease; the tasks they ran keep their ids in
     * the history. With `dryRun`, counts them instead.
     */
    async pruneLost(lostForSeconds: number, dryRun = false): Promise<number> {
      const secs = Math.max(lostForSeconds, 3 * heartbeatIntervalSeconds);
      const where = and(
        sql`${workers.lastHeartbeatAt} < now() - make_interval(secs => ${secs}::float8)`,
        holdsNoTask,
      );
      if (dryRun) {
        const [row] = await db.select({ n: sql<number>`count(*)::int` }).from(workers).where(where);
        return Number(row?.n ?? 0);
      }
      const gone = await db.delete(workers).where(where).returning({ id: workers.id });
      return gone.length;
    },

    async remove(id: string): Promise<void> {
      const removed = await db
        .delete(workers)
        .where(eq(workers.id, id))
        .returning({ id: workers.id });
      if (removed.length === 0) throw notFound(id);
    },

    /** All workers, for fleet status. */
    async all(): Promise<WorkerView[]> {
      return read(undefined);
    },
  };
}

export type FleetStore = ReturnType<typeof createFleetStore>;

function notFound(id: string): DomainError {
  return notFoundError(`worker ${id}`);
}
