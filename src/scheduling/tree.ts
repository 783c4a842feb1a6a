import { shareAncestry } from "../core/scheduling.js";
import type { Resources } from "../db/schema/index.js";

/**
 * The share tree's arithmetic, pure (no database): dominant shares,
 * hierarchical entitlements, each share's key (how far it stands from its
 * entitlement) and a claim's plan. The share book (book.ts) feeds it what
 * it reads; ListShares and the waiting reasons read what it computes.
 * docs/scheduling.md says the same in words.
 */

/**
 * What a set of leases holds as a fraction of the fleet, by its dominant
 * resource: for each resource the fleet offers, held over offered; the
 * largest. A resource the fleet does not offer (or offers without limit)
 * does not count.
 */
export function dominantShare(held: Resources, fleet: Resources): number {
  let most = 0;
  for (const [name, n] of Object.entries(held)) {
    const offered = fleet[name] ?? 0;
    if (offered > 0 && n > 0) most = Math.max(most, n / offered);
  }
  return most;
}

/** Adds `b` into `a`, resource by resource. */
export function addInto(a: Resources, b: Resources, sign = 1): Resources {
  for (const [name, n] of Object.entries(b)) a[name] = (a[name] ?? 0) + sign * n;
  return a;
}

/** One node of the tree as computed: a path with its figures. */
export interface ShareNode {
  path: string;
  weight: number;
  /** Fraction of the fleet it is entitled to now (0 without work). */
  entitlement: number;
  /** Decayed usage, as a fraction of the fleet (its subtree's). */
  usage: number;
  /** What its live leases hold now, as a fraction of the fleet (dominant; its subtree's). */
  allocation: number;
  /** Its subtree's live leases. */
  running: number;
  /** Its subtree's PENDING tasks, where known (0 otherwise). */
  pending: number;
  /** Whether tasks are charged to this path itself (a leaf of the tree's work). */
  own: boolean;
  /**
   * What this path's own tasks are entitled to: its entitlement when it has
   * no busy children, else the part of weight 1 beside them (0 without own work).
   */
  ownEntitlement: number;
}

/** What the tree is computed from: per leaf path (a task's share), and the weights set. */
export interface TreeInput {
  /** The fleet's capacity (its live workers'). */
  fleet: Resources;
  weights: Map<string, number>;
  /** Per share path with work: what its live leases hold, how many, its decayed usage, its PENDING count. */
  leaves: Map<string, { held: Resources; running: number; usage: number; pending: number }>;
}

/**
 * The tree: every path with work, its ancestors, and every path with a
 * weight set, parents before children (siblings by path). Siblings with
 * work split their parent's entitlement by weight; a path's own tasks,
 * beside its children's, count as one more child of weight 1. Without
 * work a node is entitled to nothing: what it would have goes to its busy
 * siblings (work conservation).
 */
export function computeTree(input: TreeInput): ShareNode[] {
  const nodes = new Map<string, ShareNode>();
  const node = (path: string): ShareNode => {
    let n = nodes.get(path);
    if (!n) {
      n = {
        path,
        weight: input.weights.get(path) ?? 1,
        entitlement: 0,
        usage: 0,
        allocation: 0,
        running: 0,
        pending: 0,
        own: false,
        ownEntitlement: 0,
      };
      nodes.set(path, n);
    }
    return n;
  };
  for (const path of input.weights.keys()) for (const p of shareAncestry(path)) node(p);
  const held = new Map<string, Resources>();
  for (const [path, leaf] of input.leaves) {
    node(path).own = leaf.running > 0 || leaf.pending > 0;
    for (const p of shareAncestry(path)) {
      const n = node(p);
      n.running += leaf.running;
      n.pending += leaf.pending;
      n.usage += leaf.usage;
      const sum = held.get(p) ?? {};
      held.set(p, addInto(sum, leaf.held));
    }
  }
  for (const n of nodes.values()) n.allocation = dominantShare(held.get(n.path) ?? {}, input.fleet);
  const busy = (n: ShareNode) => n.running > 0 || n.pending > 0;
  // Children by parent ("" for the top level).
  const children = new Map<string, ShareNode[]>();
  for (const n of nodes.values()) {
    const parent = n.path.includes("/") ? n.path.slice(0, n.path.lastIndexOf("/")) : "";
    children.set(parent, [...(children.get(parent) ?? []), n]);
  }
  const split = (parent: ShareNode | undefined, entitlement: number) => {
    const kids = (children.get(parent?.path ?? "") ?? []).filter(busy);
    // The parent's own tasks: one more child, of weight 1.
    const own = parent?.own ? 1 : 0;
    const total = kids.reduce((sum, k) => sum + k.weight, 0) + own;
    if (parent?.own) parent.ownEntitlement = entitlement / total;
    for (const k of kids) {
      k.entitlement = (entitlement * k.weight) / total;
      split(k, k.entitlement);
    }
  };
  split(undefined, 1);
  return [...nodes.values()].sort((a, b) => treeOrder(a.path, b.path));
}

/**
 * The order of the tree's listing: depth first, siblings by path, so that
 * a node's children follow it at once (`lab`, `lab/a`, `lab-x`: by text
 * alone `lab-x` would come between `lab` and `lab/a`). Negative when `a`
 * comes first.
 */
export function treeOrder(a: string, b: string): number {
  const [x, y] = [a.split("/"), b.split("/")];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const [p, q] = [x[i] ?? "", y[i] ?? ""];
    if (p !== q) return p < q ? -1 : 1;
  }
  return x.length - y.length;
}

/**
 * A share's key: how far it stands from its entitlement, lower first:
 * (decayed usage + what it holds now) over its entitlement. Holding
 * counts at once (a claim's grants move it); usage remembers the recent
 * past with its half-life, so a share that used much lately waits behind
 * one that did not. Without entitlement (no work) a share has no key.
 */
export function shareKey(usage: number, allocation: number, entitlement: number): number {
  return entitlement > 0 ? (usage + allocation) / entitlement : Number.POSITIVE_INFINITY;
}

/** One share as a plan sees it. */
export interface PlanShare {
  path: string;
  key: number;
  entitlement: number;
  /** What one of its tasks costs, as a fraction of the fleet (dominant). */
  cost: number;
}

/**
 * The picks of `max` tasks over the shares, furthest below its entitlement
 * first: water-filling, each pick raising its share's key by its cost over
 * its entitlement; `chunk` picks of one share at a time (a claim then reads
 * fewer shares: each share costs it a scan). Returns the shares' indexes into `shares` in the order
 * they are picked. `shares` sorted by key; only the first few are ever
 * read (O(max log max)). A plan: the claim takes what fits and fills the
 * rest from anyone.
 */
export function planPicks(shares: readonly PlanShare[], max: number, chunk = 1): number[] {
  const picks: number[] = [];
  // A small binary heap of [key, index].
  const heap: [number, number][] = [];
  const at = (i: number) => heap[i] as [number, number];
  const push = (item: [number, number]) => {
    heap.push(item);
    for (let i = heap.length - 1; i > 0; ) {
      const p = (i - 1) >> 1;
      if (at(p)[0] <= item[0]) break;
      heap[i] = at(p);
      heap[p] = item;
      i = p;
    }
  };
  const pop = (): [number, number] | undefined => {
    const top = heap[0];
    const last = heap.pop();
    if (heap.length > 0 && last) {
      heap[0] = last;
      for (let i = 0; ; ) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < heap.length && at(l)[0] < at(m)[0]) m = l;
        if (r < heap.length && at(r)[0] < at(m)[0]) m = r;
        if (m === i) break;
        [heap[i], heap[m]] = [at(m), at(i)];
        i = m;
      }
    }
    return top;
  };
  let next = 0;
  while (picks.length < max) {
    // Open the next share in key order while it stands at or below the heap's best.
    while (
      next < shares.length &&
      (heap.length === 0 || (shares[next] as PlanShare).key <= at(0)[0])
    ) {
      push([(shares[next] as PlanShare).key, next]);
      next++;
    }
    const top = pop();
    if (!top) break;
    const s = shares[top[1]] as PlanShare;
    const n = Math.min(chunk, max - picks.length);
    for (let i = 0; i < n; i++) picks.push(top[1]);
    push([top[0] + (n * s.cost) / Math.max(s.entitlement, 1e-9), top[1]]);
  }
  return picks;
}
