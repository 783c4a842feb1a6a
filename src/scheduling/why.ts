import { create } from "@bufbuild/protobuf";
import { and, eq, sql } from "drizzle-orm";
import { WaitKind, type WaitReason, WaitReasonSchema } from "../../gen/meshwork/v1/task_pb.js";
import { describeRequirement, describeShortfall } from "../core/scheduling.js";
import type { Db } from "../db/database.js";
import { deliveries, type Resources, type TaskRow } from "../db/schema/index.js";
import { asBoolean, asNumber, rowsOf } from "../db/values.js";
import type { ShareSnapshot } from "./book.js";

/** One worker as the waiting reasons judge it against one task (every verdict the database's). */
interface Verdict {
  id: string;
  name: string;
  live: boolean;
  drained: boolean;
  hasWorkload: boolean;
  missing: string[];
  affinityMissing: string[];
  unmet: number[];
  bigEnough: boolean;
  total: Resources;
  free: Resources;
  freeUnreserved: Resources;
  reservedTaskId: string | null;
  maxConcurrency: number;
}

const json = (v: unknown): Resources => {
  const map = (typeof v === "string" ? JSON.parse(v) : v) as Record<string, unknown> | null;
  return Object.fromEntries(Object.entries(map ?? {}).map(([k, n]) => [k, Number(n)]));
};

/** What a PENDING task waits for: every reason that applies now, and its place in its share's queue. */
export interface Waiting {
  waiting: WaitReason[];
  /** 1 = the next its share serves; 0 when the task is not PENDING. */
  queuePosition: number;
}

const reason = (kind: WaitKind, message: string, detail: Record<string, number> = {}) =>
  create(WaitReasonSchema, {
    kind,
    message,
    detail: Object.fromEntries(Object.entries(detail).map(([k, v]) => [k, BigInt(Math.round(v))])),
  });

const pct = (f: number) => `${Math.round(f * 1000) / 10}%`;

/**
 * Why a PENDING task has not been taken, computed when asked (never stored):
 * every reason a claim or placement would refuse it now, judged by the
 * same database functions the claim uses (scheduling/sql/*.sql,
 * leases/sql/match.sql) against every registered worker, its limits, and
 * the share book's last view of the shares.
 */
export function createWaitingReasons(deps: {
  db: Db;
  heartbeatIntervalSeconds: number;
  shares: () => ShareSnapshot;
}) {
  const { db } = deps;

  async function workers(task: TaskRow): Promise<Verdict[]> {
    const rows = await rowsOf<Record<string, unknown>>(
      db,
      sql`select w.id, w.name, w.drained, w.max_concurrency, w.reserved_task_id,
          w.last_heartbeat_at >= now() - make_interval(secs => ${3 * deps.heartbeatIntervalSeconds}) as live,
          t.workload = any (w.capabilities) as has_workload,
          array(select c from unnest(t.required_capabilities) as c where not c = any (w.capabilities)) as missing,
          array(select a.key from jsonb_each_text(t.affinity) as a where w.labels->>a.key is distinct from a.value) as affinity_missing,
          array(select r.i - 1 from jsonb_array_elements(t.requirements) with ordinality as r(v, i)
            where not meshwork_requirement_holds(r.v, w.labels)) as unmet,
          meshwork_fits_in(t.resources, meshwork_capacity(w)) as big_enough,
          meshwork_capacity(w) as total,
          meshwork_free(w, t.id) as free,
          meshwork_minus(meshwork_capacity(w), meshwork_allocated(w.id)) as free_unreserved
        from workers w, tasks t where t.id = ${task.id}::uuid`,
    );
    const list = (v: unknown) => (Array.isArray(v) ? v : []) as unknown[];
    return rows.map((r) => ({
      id: String(r.id),
      name: String(r.name ?? ""),
      live: asBoolean(r.live),
      drained: asBoolean(r.drained),
      hasWorkload: asBoolean(r.has_workload),
      missing: list(r.missing).map(String),
      affinityMissing: list(r.affinity_missing).map(String),
      unmet: list(r.unmet).map(Number),
      bigEnough: asBoolean(r.big_enough),
      total: json(r.total),
      free: json(r.free),
      freeUnreserved: json(r.free_unreserved),
      reservedTaskId: r.reserved_task_id ? String(r.reserved_task_id) : null,
      maxConcurrency: asNumber(r.max_concurrency),
    }));
  }

  async function limits(task: TaskRow) {
    const at = (d: Date | null) => (d && Number.isFinite(d.getTime()) ? d.toISOString() : null);
    // While its dependencies wait, not_before is 'infinity'; its own start time is run_at.
    const notBefore = task.dependenciesPending > 0 ? task.runAt : task.notBefore;
    const [row] = await rowsOf<Record<string, unknown>>(
      db,
      sql`select
          (select max_running from concurrency_limits where key = ${task.concurrencyKey}) as max_running,
          meshwork_key_running(${task.concurrencyKey}) as running,
          (select meshwork_rate_tokens(r) from rate_limits r where r.key = ${task.rateKey}) as tokens,
          (select per_second from rate_limits r where r.key = ${task.rateKey}) as per_second,
          greatest(0, extract(epoch from ${at(notBefore)}::timestamptz - now())) as not_before_seconds,
          (select count(*) from tasks o where o.state = 'PENDING' and o.dependencies_pending = 0
            and o.share = ${task.share}
            and (o.priority > ${task.priority}
              or (o.priority = ${task.priority} and (
                (o.deadline is not null and (${at(task.deadline)}::timestamptz is null or o.deadline < ${at(task.deadline)}::timestamptz))
                or (o.deadline is not distinct from ${at(task.deadline)}::timestamptz
                  and (o.created_at, o.id) < (${at(task.createdAt)}::timestamptz, ${task.id}::uuid)))))) as ahead`,
    );
    const num = (v: unknown) => (v === null || v === undefined ? null : asNumber(v));
    return {
      maxRunning: num(row?.max_running),
      running: asNumber(row?.running),
      tokens: num(row?.tokens),
      perSecond: num(row?.per_second),
      notBeforeSeconds: asNumber(row?.not_before_seconds),
      ahead: asNumber(row?.ahead),
    };
  }

  function capacityReasons(task: TaskRow, all: Verdict[]): WaitReason[] {
    const eligible = all.filter((w) => w.live && !w.drained);
    const matching = eligible.filter(
      (w) =>
        w.hasWorkload &&
        w.missing.length === 0 &&
        w.affinityMissing.length === 0 &&
        w.unmet.length === 0,
    );
    if (matching.length === 0) {
      const counts = new Map<string, number>();
      const count = (what: string) => counts.set(what, (counts.get(what) ?? 0) + 1);
      for (const w of eligible) {
        if (!w.hasWorkload) count(`workload ${task.workload}`);
        for (const c of w.missing) count(`capability ${c}`);
        for (const k of w.affinityMissing) count(`affinity ${k}=${task.affinity[k] ?? ""}`);
        for (const i of w.unmet) {
          const r = task.requirements[i];
          if (r) count(`requirement ${describeRequirement(r)}`);
        }
      }
      const parts = [...counts].map(([what, n]) => `${n} fail ${what}`);
      const message =
        eligible.length === 0
          ? `no live, undrained worker is registered (${all.length} registered)`
          : `none of the ${eligible.length} live, undrained workers can run it: ${parts.join("; ")}`;
      return [
        reason(WaitKind.NO_MATCHING_WORKER, message, {
          live_workers: eligible.length,
          ...Object.fromEntries(counts),
        }),
      ];
    }
    const big = matching.filter((w) => w.bigEnough);
    if (big.length === 0) {
      const largest: Resources = {};
      for (const w of matching) {
        for (const [k, v] of Object.entries(w.total)) largest[k] = Math.max(largest[k] ?? 0, v);
      }
      const short = describeShortfall(task.resources, largest, largest, 1).join(", ");
      return [
        reason(
          WaitKind.NO_CAPACITY,
          `no matching worker is large enough, even idle: ${short}`,
          Object.fromEntries(Object.entries(task.resources).map(([k]) => [k, largest[k] ?? 0])),
        ),
      ];
    }
    const fitsNow = (free: Resources) =>
      Object.entries(task.resources).every(([k, n]) => (free[k] ?? 0) >= n);
    if (big.some((w) => fitsNow(w.free))) return [];
    const out: WaitReason[] = [];
    const mine = big.find((w) => w.reservedTaskId === task.id);
    const heldBack = big.filter((w) => w.reservedTaskId !== task.id && fitsNow(w.freeUnreserved));
    if (mine) {
      out.push(
        reason(
          WaitKind.RESERVED,
          `holds a reservation on worker ${mine.name || mine.id}: it runs there as soon as ${describeShortfall(task.resources, mine.freeUnreserved, mine.total, mine.maxConcurrency).join(", ")} turns free; smaller tasks get only what it leaves`,
        ),
      );
    } else if (heldBack.length > 0) {
      out.push(
        reason(
          WaitKind.RESERVED,
          `${heldBack.length} worker(s) that could run it now are held for larger tasks that waited longer`,
          { workers: heldBack.length },
        ),
      );
    }
    const most: Resources = {};
    for (const w of big) {
      for (const k of Object.keys(task.resources)) most[k] = Math.max(most[k] ?? 0, w.free[k] ?? 0);
    }
    const short = Object.entries(task.resources)
      .filter(([k, n]) => (most[k] ?? 0) < n)
      .map(([k, n]) => `${k} ${n} asked, at most ${Math.max(0, most[k] ?? 0)} free`);
    out.push(
      reason(
        WaitKind.NO_CAPACITY,
        `${big.length} matching worker(s) could run it, none has it free now: ${short.join(", ") || "what it asks is spread over several workers"}`,
        most,
      ),
    );
    return out;
  }

  function shareReason(task: TaskRow): WaitReason[] {
    const { order, tree } = deps.shares();
    const mine = order.find((s) => s.path === task.share);
    const node = tree.get(task.share);
    if (!mine || !node) return [];
    const ahead = order.filter((s) => s.key < mine.key);
    if (ahead.length === 0 || node.allocation < mine.entitlement) return [];
    return [
      reason(
        WaitKind.SHARE_OVER_ENTITLEMENT,
        `share ${task.share} holds ${pct(node.allocation)} of the fleet (usage ${pct(node.usage)}) against an entitlement of ${pct(mine.entitlement)}: ${ahead.length} share(s) further below theirs are served first`,
        {
          allocation_ppm: node.allocation * 1e6,
          usage_ppm: node.usage * 1e6,
          entitlement_ppm: mine.entitlement * 1e6,
          shares_ahead: ahead.length,
        },
      ),
    ];
  }

  /** An ASSIGNED task with dispatch waits for its delivery while the worker has not accepted it. */
  async function delivering(task: TaskRow): Promise<Waiting> {
    const [d] = await db
      .select()
      .from(deliveries)
      .where(and(eq(deliveries.taskId, task.id), eq(deliveries.attempt, task.attempt)));
    if (d?.state !== "DELIVERING") return { waiting: [], queuePosition: 0 };
    const last =
      d.lastStatus > 0 ? `; last answer ${d.lastStatus}` : d.lastError ? `; ${d.lastError}` : "";
    return {
      waiting: [
        reason(
          WaitKind.DELIVERING,
          `being delivered to worker ${d.workerId} (${d.tries} request(s) sent${last})`,
          { tries: d.tries, last_status: d.lastStatus },
        ),
      ],
      queuePosition: 0,
    };
  }

  return {
    async of(task: TaskRow): Promise<Waiting> {
      if (task.state === "ASSIGNED" && task.dispatch) return delivering(task);
      if (task.state !== "PENDING") return { waiting: [], queuePosition: 0 };
      const [all, l] = await Promise.all([workers(task), limits(task)]);
      const waiting: WaitReason[] = [];
      if (task.dependenciesPending > 0) {
        const total = task.dependsOn.length;
        waiting.push(
          reason(
            WaitKind.DEPENDENCIES,
            `waits for ${task.dependenciesPending} of its ${total} dependencies to finish`,
            { pending: task.dependenciesPending, total },
          ),
        );
      }
      if (l.notBeforeSeconds > 0) {
        const start = task.dependenciesPending > 0 ? task.runAt : task.notBefore;
        waiting.push(
          reason(
            WaitKind.NOT_BEFORE,
            `held back until ${start?.toISOString()} (${Math.ceil(l.notBeforeSeconds)} s)`,
            { seconds: Math.ceil(l.notBeforeSeconds) },
          ),
        );
      }
      waiting.push(...capacityReasons(task, all));
      if (l.maxRunning !== null && l.running >= l.maxRunning) {
        waiting.push(
          reason(
            WaitKind.CONCURRENCY_LIMIT,
            `${l.running} task(s) with concurrency_key ${task.concurrencyKey} hold leases; its limit is ${l.maxRunning}`,
            { running: l.running, max_running: l.maxRunning },
          ),
        );
      }
      if (l.tokens !== null && l.tokens < 1) {
        waiting.push(
          reason(
            WaitKind.RATE_LIMIT,
            `rate_key ${task.rateKey} has no token left (${l.tokens.toFixed(2)}; ${l.perSecond} a second)`,
            { tokens_milli: l.tokens * 1000, per_second_milli: (l.perSecond ?? 0) * 1000 },
          ),
        );
      }
      waiting.push(...shareReason(task));
      return { waiting, queuePosition: l.ahead + 1 };
    },
  };
}

export type WaitingReasons = ReturnType<typeof createWaitingReasons>;
