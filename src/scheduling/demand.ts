import { sql } from "drizzle-orm";
import { invalid } from "../core/errors.js";
import { resourceNamePattern } from "../core/scheduling.js";
import type { Db } from "../db/database.js";
import type { Resources } from "../db/schema/index.js";
import { asNumber, rowsOf } from "../db/values.js";

/**
 * Demand for an autoscaler (KEDA, GetFleetStatus, /metrics): how many
 * workers of one shape a pool of work needs, by resources rather than by
 * task count. A pool is a workload, the labels its workers carry (a
 * selector), and the capacity of one of its workers.
 */
export interface Pool {
  workload: string;
  /** Each key with the values a worker of the pool may carry (`key=value`: one). */
  selector: Map<string, string[]>;
  /** One worker's capacity; `slots` absent: slots do not bound it. */
  capacity: Resources;
}

/** What a pool needs now. */
export interface Demand {
  /** Workers of the pool's capacity its PENDING and leased tasks need together (0: none). */
  workersNeeded: number;
  /** Its PENDING tasks (that one worker of the pool could run). */
  pending: number;
  /** Its tasks holding live leases on workers of the pool. */
  leased: number;
  /** How long its oldest PENDING task has waited, in seconds (0: none waits). */
  backlogAgeSeconds: number;
}

/**
 * A selector as KEDA's scalerMetadata writes it: `key=value`, `key in
 * (a|b)`, comma-separated; empty: any labels.
 */
export function parseSelector(text: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  if (text.trim() === "") return out;
  for (const part of text.split(/,(?![^(]*\))/)) {
    const eq = /^\s*([^=\s()]+)\s*=\s*([^=\s()]*)\s*$/.exec(part);
    const inSet = /^\s*([^=\s()]+)\s+in\s+\(([^)]*)\)\s*$/i.exec(part);
    if (eq?.[1] !== undefined) out.set(eq[1], [eq[2] ?? ""]);
    else if (inSet?.[1] !== undefined) {
      const values = (inSet[2] ?? "")
        .split("|")
        .map((v) => v.trim())
        .filter((v) => v !== "");
      if (values.length === 0) throw invalid(`selector: ${part.trim()} names no value`);
      out.set(inSet[1], values);
    } else {
      throw invalid(`selector: ${JSON.stringify(part.trim())} is not key=value or key in (a|b)`);
    }
  }
  return out;
}

/** A capacity as KEDA's scalerMetadata writes it: `cpu=4000,memory=16384,gpu=1`. */
export function parseCapacity(text: string): Resources {
  const out: Resources = {};
  if (text.trim() === "") return { slots: 1 };
  for (const part of text.split(",")) {
    const m = /^\s*([^=\s]+)\s*=\s*([0-9]{1,15})\s*$/.exec(part);
    if (!m?.[1] || !resourceNamePattern.test(m[1])) {
      throw invalid(`workerCapacity: ${JSON.stringify(part.trim())} is not name=quantity`);
    }
    out[m[1]] = Number(m[2]);
  }
  return out;
}

/** Every label map a worker of the selector may carry (at most 64: the rest are not tried). */
function labelMaps(selector: Map<string, string[]>): Record<string, string>[] {
  let maps: Record<string, string>[] = [{}];
  for (const [key, values] of selector) {
    maps = maps.flatMap((m) => values.map((v) => ({ ...m, [key]: v }))).slice(0, 64);
  }
  return maps;
}

/**
 * How many workers of `capacity` hold what the tasks ask together: for
 * each resource it offers, the sum asked over what one offers, rounded up;
 * the most of these.
 */
export function workersFor(asked: Resources, capacity: Resources): number {
  let most = 0;
  for (const [name, offered] of Object.entries(capacity)) {
    if (offered > 0) most = Math.max(most, Math.ceil((asked[name] ?? 0) / offered));
  }
  return most;
}

/** Reads a pool's demand: its PENDING tasks (one scan of its workload's) and its live leases. */
export async function readDemand(db: Db, pool: Pool): Promise<Demand> {
  const maps = JSON.stringify(labelMaps(pool.selector));
  const selector = JSON.stringify(Object.fromEntries(pool.selector));
  const capacity = JSON.stringify(pool.capacity);
  // A capacity that names resources (not only slots) offers none of the others.
  const shaped = Object.keys(pool.capacity).some((k) => k !== "slots");
  const rows = await rowsOf<{
    kind: string;
    key: string | null;
    total: unknown;
    n: unknown;
    age: unknown;
  }>(
    db,
    // The PENDING tasks are grouped by exactly the columns the pool's
    // checks read, and each shape is checked once: a backlog has few
    // shapes, and the checks (JSON functions) cost a few µs a row. At
    // 1,000,000 PENDING tasks of one workload the read took 5.3-5.7 s
    // checked row by row, 1.8 s grouped. A shape's resources times its
    // count are summed as numeric: quantities go up to 10^15, and a
    // bigint product overflows.
    sql`with shapes as (
        select t.affinity, t.requirements, t.resources, count(*) as n, min(t.created_at) as oldest
        from tasks t
        where t.workload = ${pool.workload} and t.state = 'PENDING'
          -- Not what waits for a time or for its dependencies: no worker runs it yet.
          and (t.not_before is null or t.not_before <= now())
        group by t.affinity, t.requirements, t.resources
      ), pending as (
        select s.resources, s.n, s.oldest from shapes s
        where exists (select 1 from jsonb_array_elements(${maps}::jsonb) as l
            where s.affinity <@ l.value
              and (s.requirements = '[]'::jsonb or meshwork_requirements_hold(s.requirements, l.value)))
          -- Only what one worker of the pool could ever hold: no more of a
          -- resource than it offers, and none of one it does not.
          and not exists (select 1 from jsonb_each_text(s.resources) as a
            where case when ${capacity}::jsonb ? a.key
              then a.value::bigint > (${capacity}::jsonb ->> a.key)::bigint
              else ${shaped}::boolean and a.key <> 'slots' and a.value::bigint > 0 end)
      ), leased as (
        select t.resources from tasks t join workers w on w.id = t.lease_worker_id
        where t.workload = ${pool.workload} and meshwork_lease_live(t)
          and not exists (select 1 from jsonb_each(${selector}::jsonb) as s
            where not coalesce(s.value ? (w.labels ->> s.key), false))
      )
      select 'pending' as kind, e.key, sum(e.value::numeric * p.n) as total, null::bigint as n, null::float8 as age
        from pending p, jsonb_each_text(p.resources) as e group by e.key
      union all
      select 'leased', e.key, sum(e.value::bigint), null, null
        from leased l, jsonb_each_text(l.resources) as e group by e.key
      union all
      select 'count', 'pending', null, coalesce(sum(p.n), 0)::bigint,
        extract(epoch from now() - min(p.oldest))::float8 from pending p
      union all
      select 'count', 'leased', null, count(*), null from leased`,
  );
  const asked: Resources = {};
  let pending = 0;
  let leased = 0;
  let backlogAgeSeconds = 0;
  for (const r of rows) {
    if (r.kind === "count" && r.key === "pending") {
      pending = asNumber(r.n);
      backlogAgeSeconds = pending > 0 ? Math.max(0, asNumber(r.age)) : 0;
    } else if (r.kind === "count") leased = asNumber(r.n);
    else if (r.key) asked[r.key] = (asked[r.key] ?? 0) + asNumber(r.total);
  }
  return { workersNeeded: workersFor(asked, pool.capacity), pending, leased, backlogAgeSeconds };
}

/** A worker as the autoscaling figures see it. */
export interface WorkerShape {
  capabilities: readonly string[];
  /** Its capacity, `slots` included (0: no limit). */
  capacity: Resources;
  lost: boolean;
}

/**
 * The capacity of one worker of a workload's pool, for GetFleetStatus and
 * /metrics (which know no KEDA trigger): the largest live worker that
 * offers the workload, by slots, then cpu, then memory; `slots: 1` when
 * none does. A worker without a slot limit counts no slots.
 */
export function poolCapacity(workload: string, workers: readonly WorkerShape[]): Resources {
  const offering = workers.filter((w) => !w.lost && w.capabilities.includes(workload));
  const size = (c: Resources) => [c.slots || Number.MAX_SAFE_INTEGER, c.cpu ?? 0, c.memory ?? 0];
  let best: Resources | undefined;
  for (const w of offering) {
    if (!best) best = w.capacity;
    else {
      const [a, b] = [size(w.capacity), size(best)];
      const i = a.findIndex((v, k) => v !== b[k]);
      if (i >= 0 && (a[i] ?? 0) > (b[i] ?? 0)) best = w.capacity;
    }
  }
  if (!best) return { slots: 1 };
  const { slots, ...rest } = best;
  return slots ? { ...rest, slots } : rest;
}

/**
 * Each backlogged workload's demand, in workers of its pool's capacity
 * (poolCapacity): GetFleetStatus and /metrics, which know no KEDA trigger.
 */
export async function demandByWorkload(
  workloads: readonly string[],
  workers: readonly WorkerShape[],
  demand: (pool: Pool) => Promise<Demand>,
): Promise<Map<string, { capacity: Resources; workersNeeded: number }>> {
  const out = new Map<string, { capacity: Resources; workersNeeded: number }>();
  for (const workload of workloads) {
    const capacity = poolCapacity(workload, workers);
    const { workersNeeded } = await demand({ workload, selector: new Map(), capacity });
    out.set(workload, { capacity, workersNeeded });
  }
  return out;
}
