import { quickestOfLast } from "../core/quickest.js";
import type { Resources } from "../db/schema/index.js";
import type { Logger } from "../log.js";
import type { SchedulingStore } from "./store.js";
import {
  addInto,
  computeTree,
  dominantShare,
  type PlanShare,
  planPicks,
  type ShareNode,
  shareKey,
} from "./tree.js";

/** What the book knows of one share path with work. */
interface Leaf {
  held: Resources;
  running: number;
  usage: number;
  /** Whether it had PENDING tasks at the last refresh. */
  pending: boolean;
}

/** A claim's plan: its shares, and its picks in order as indexes into them. */
export interface ClaimPlan {
  shares: string[];
  seq: number[];
}

/** The book as last computed: what ListShares' figures and the waiting reasons read. */
export interface ShareSnapshot {
  fleet: Resources;
  tree: Map<string, ShareNode>;
  /** The shares with PENDING tasks, furthest below their entitlement first. */
  order: readonly PlanShare[];
}

/**
 * How often the book reads its tables: every second while reads are quick,
 * and at most once every `readBudgetFactor` times as long as the quickest
 * of the last three reads took (up to `readMaxIntervalMs`), so that reading
 * takes at most a twentieth of the time. A read sums what every live lease
 * holds; behind a transaction that pins the xmin horizon it also walks the
 * dead entry of every lease granted in the last lease_seconds (300 ms and
 * more after ten minutes of a busy drain, on two parallel workers), and
 * read each second it took a third of a core. Between reads this replica's
 * own grants and ends count at once; other replicas' count later.
 */
export const readBudgetFactor = 20;
export const readMaxIntervalMs = 10_000;

/** The time from one read to the next, after reads that took `readMs` at the quickest (at least `leastMs`). */
export function readInterval(readMs: number, leastMs = 1000): number {
  return Math.max(leastMs, Math.min(readBudgetFactor * readMs, readMaxIntervalMs));
}

/**
 * One replica's view of the share tree, for its claims: every second
 * (less often while its reads are slow: readInterval) it reads what the
 * fleet offers, what each share's live leases hold, which
 * shares have PENDING tasks, the weights and the decayed usage (and moves
 * the usage on to now), then ranks the shares with work by their key
 * (tree.ts). Between reads, the leases this replica grants count at once
 * (`granted`), so that its next claims see them; other replicas' grants
 * count from the next read (a second at most while reads are quick). A claim gets a plan from it
 * (`plan`): how many tasks of which shares to take first. Fairness is an
 * order, so a view a second old costs a little precision, never safety:
 * resources and limits are decided in the claim's own statement.
 */
export function createShareBook(deps: {
  store: SchedulingStore;
  config: { shareHalfLifeMs: number; reserveAfterMs: number };
  log: Logger;
}) {
  const { store, config } = deps;
  let leaves = new Map<string, Leaf>();
  let fleet: Resources = {};
  let tree = new Map<string, ShareNode>();
  let order: PlanShare[] = [];
  // Grants and ends since the last rank: the order is made again when next
  // asked for, once for all of them (a claim and a completion each change
  // it; only a claim's plan and a snapshot, for the waiting reasons and the
  // metrics, read it).
  let unranked = false;
  let refreshing: Promise<void> | undefined;
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  const lastReserveLook = new Map<string, number>();

  /** A task's cost in a share: what its running tasks hold on average, else one slot's worth. */
  const costOf = (leaf: Leaf): number => {
    const held = dominantShare(leaf.held, fleet);
    if (leaf.running > 0 && held > 0) return held / leaf.running;
    return dominantShare({ slots: 1 }, fleet) || 0.01;
  };

  function rank(): void {
    unranked = false;
    order = [];
    for (const [path, leaf] of leaves) {
      if (!leaf.pending) continue;
      const entitlement = tree.get(path)?.ownEntitlement ?? 0;
      order.push({
        path,
        key: shareKey(leaf.usage, dominantShare(leaf.held, fleet), entitlement),
        entitlement,
        cost: costOf(leaf),
      });
    }
    order.sort((a, b) => a.key - b.key || (a.path < b.path ? -1 : 1));
  }

  async function read(): Promise<void> {
    const [capacity, held, pending, weights, usage] = await Promise.all([
      store.fleetCapacity(),
      store.heldByShare(),
      store.sharesWithPending(),
      store.weights(),
      store.usage(config.shareHalfLifeMs),
    ]);
    const next = new Map<string, Leaf>();
    for (const [path, h] of held) {
      next.set(path, { ...h, usage: usage.get(path) ?? 0, pending: false });
    }
    for (const path of pending) {
      const leaf = next.get(path) ?? {
        held: {},
        running: 0,
        usage: usage.get(path) ?? 0,
        pending: true,
      };
      leaf.pending = true;
      next.set(path, leaf);
    }
    fleet = capacity;
    leaves = next;
    const computed = computeTree({
      fleet,
      weights,
      leaves: new Map([...next].map(([path, l]) => [path, { ...l, pending: l.pending ? 1 : 0 }])),
    });
    tree = new Map(computed.map((n) => [n.path, n]));
    rank();
    const allocation = new Map([...next].map(([path, l]) => [path, dominantShare(l.held, fleet)]));
    // No share holds or waits and no usage is left to decay (an idle
    // fleet): the three statements would change nothing. A share another
    // replica starts meanwhile is moved on by that replica.
    if (allocation.size === 0 && usage.size === 0) return;
    await store.decayUsage(allocation, config.shareHalfLifeMs);
  }

  return {
    /** Reads the tables and ranks the shares again (one read at a time). */
    refresh(): Promise<void> {
      refreshing ??= read().finally(() => {
        refreshing = undefined;
      });
      return refreshing;
    },

    /**
     * Plans for claims made together (one statement): the picks of a
     * water-filling over every share with work, for all of them at once,
     * dealt out among the claims in turn (so that they do not all start on
     * the same share). Each plan names its shares and its picks in order
     * (src/leases/sql/claim.sql); null for every claim when fewer than two
     * shares have PENDING tasks (a claim's own order is then the share's).
     */
    plans(maxes: readonly number[]): (ClaimPlan | null)[] {
      if (unranked) rank();
      if (order.length < 2) return maxes.map(() => null);
      // A claim reads at most about 4 shares: picks come in chunks of a
      // quarter of the largest claim. Fairness is kept across claims, each
      // served by the shares furthest below their part at the time.
      const chunk = Math.max(1, Math.ceil(Math.max(...maxes) / 4));
      const picks = planPicks(
        order,
        maxes.reduce((sum, m) => sum + m, 0),
        chunk,
      );
      const dealt: number[][] = maxes.map(() => []);
      let k = 0;
      for (let i = 0; i < picks.length; ) {
        // The next claim (in turn) that still wants a task takes the next chunk.
        for (let tries = 0; tries < maxes.length; tries++, k = (k + 1) % maxes.length) {
          if ((dealt[k] as number[]).length < (maxes[k] ?? 0)) break;
        }
        const mine = dealt[k] as number[];
        const want = (maxes[k] ?? 0) - mine.length;
        for (let n = 0; n < Math.min(chunk, want) && i < picks.length; n++)
          mine.push(picks[i++] as number);
        k = (k + 1) % maxes.length;
      }
      return dealt.map((own) => {
        if (own.length === 0) return null;
        const index = new Map<number, number>();
        const shares: string[] = [];
        const seq = own.map((pick) => {
          let i = index.get(pick);
          if (i === undefined) {
            i = shares.length;
            index.set(pick, i);
            shares.push((order[pick] as PlanShare).path);
          }
          return i;
        });
        return { shares, seq };
      });
    },

    /** Counts leases this replica granted at once, before the next read. */
    granted(rows: readonly { share: string; resources: Resources }[]): void {
      if (rows.length === 0) return;
      for (const r of rows) {
        const leaf = leaves.get(r.share) ?? { held: {}, running: 0, usage: 0, pending: true };
        addInto(leaf.held, r.resources);
        leaf.running += 1;
        leaves.set(r.share, leaf);
      }
      unranked = true;
    },

    /** Counts leases ended through this replica at once, before the next read. */
    ended(rows: readonly { share: string; resources: Resources }[]): void {
      if (rows.length === 0) return;
      for (const r of rows) {
        const leaf = leaves.get(r.share);
        if (!leaf) continue;
        addInto(leaf.held, r.resources, -1);
        leaf.running = Math.max(0, leaf.running - 1);
      }
      unranked = true;
    },

    /**
     * The reservation bound to pass a claim of `workerId`: config's, at most
     * once per bound and once a second per worker (each look costs a
     * bounded walk); null otherwise, or when reservations are off.
     */
    reserveAfterMs(workerId: string, now = Date.now()): number | null {
      if (config.reserveAfterMs === 0) return null;
      const last = lastReserveLook.get(workerId) ?? 0;
      if (now - last < Math.min(1000, config.reserveAfterMs)) return null;
      lastReserveLook.set(workerId, now);
      if (lastReserveLook.size > 100_000) lastReserveLook.clear();
      return config.reserveAfterMs;
    },

    snapshot(): ShareSnapshot {
      if (unranked) rank();
      return { fleet, tree, order };
    },

    /**
     * Reads now, then every `intervalMs`, or less often while reads are
     * slow (readInterval); a failed read is logged and tried again next time.
     */
    start(intervalMs = 1000): void {
      const took = quickestOfLast(3);
      const tick = async () => {
        const began = performance.now();
        try {
          await this.refresh();
          // Only reads that succeeded: a failed one is tried again on time.
          took.add(performance.now() - began);
        } catch (error) {
          deps.log.warn({ err: error }, "reading the share tree failed");
        }
        if (stopped) return;
        timer = setTimeout(tick, readInterval(took.ms(), intervalMs));
        timer.unref();
      };
      stopped = false;
      void tick();
    },

    async stop(): Promise<void> {
      stopped = true;
      clearTimeout(timer);
      await refreshing?.catch(() => {});
    },
  };
}

export type ShareBook = ReturnType<typeof createShareBook>;
