import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import {
  type ConcurrencyLimit,
  ConcurrencyLimitSchema,
  type ConcurrencyService,
  type RateLimit,
  RateLimitSchema,
} from "../../gen/meshwork/v1/concurrency_pb.js";
import { type Share, ShareSchema, type ShareService } from "../../gen/meshwork/v1/share_pb.js";
import type { Config } from "../config.js";
import { invalid } from "../core/errors.js";
import { byKey, decodeKeyCursor, pageOf, pageSize } from "../core/paging.js";
import { limitKey, sharePath } from "../core/scheduling.js";
import { intInRange } from "../core/validate.js";
import type { ShareBook } from "./book.js";
import type { LimitRow, RateRow, SchedulingStore } from "./store.js";
import { computeTree, type ShareNode, treeOrder } from "./tree.js";

/** What ShareService and ConcurrencyService use. */
export interface SchedulingServiceDeps {
  config: Pick<Config, "shareHalfLifeMs">;
  scheduling: SchedulingStore;
  shareBook: Pick<ShareBook, "refresh">;
}

function toShare(n: ShareNode): Share {
  return create(ShareSchema, {
    path: n.path,
    weight: n.weight,
    entitlement: n.entitlement,
    usage: n.usage,
    allocation: n.allocation,
    running: BigInt(n.running),
    pending: BigInt(n.pending),
  });
}

/**
 * The share tree as it stands now, read fresh (not the book's last view):
 * every node with a weight set or with work, with its figures.
 */
async function readTree(app: SchedulingServiceDeps): Promise<ShareNode[]> {
  const store = app.scheduling;
  const [fleet, held, pending, weights, usage] = await Promise.all([
    store.fleetCapacity(),
    store.heldByShare(),
    store.pendingByShare(),
    store.weights(),
    store.usage(app.config.shareHalfLifeMs),
  ]);
  const leaves = new Map<
    string,
    { held: Record<string, number>; running: number; usage: number; pending: number }
  >();
  for (const path of new Set([...held.keys(), ...pending.keys()])) {
    const h = held.get(path);
    leaves.set(path, {
      held: h?.held ?? {},
      running: h?.running ?? 0,
      usage: usage.get(path) ?? 0,
      pending: pending.get(path) ?? 0,
    });
  }
  return computeTree({ fleet, weights, leaves });
}

/** A weight: above 0, at most 10^6. */
function weightField(value: number): number {
  if (!(Number.isFinite(value) && value > 0 && value <= 1e6)) {
    throw invalid(`weight must be above 0 and at most 1000000, not ${value}`);
  }
  return value;
}

/** ShareService: weights of the share tree, and the tree as it stands. */
export function createShareService(app: SchedulingServiceDeps): ServiceImpl<typeof ShareService> {
  return {
    async setShare(req) {
      const path = sharePath("path", req.path);
      await app.scheduling.setShare(path, weightField(req.weight));
      void app.shareBook.refresh().catch(() => {});
      const node = (await readTree(app)).find((n) => n.path === path);
      if (!node) throw new Error("a share just set is not in the tree");
      return { share: toShare(node) };
    },

    async deleteShare(req) {
      const deleted = await app.scheduling.deleteShare(sharePath("path", req.path));
      void app.shareBook.refresh().catch(() => {});
      return { deleted };
    },

    async listShares(req) {
      const size = pageSize(req.pageSize);
      const after = decodeKeyCursor(req.pageToken);
      const tree = await readTree(app);
      // The tree's order (parents first, siblings by path) is not the
      // paths' text order: a page starts after the node the token names, or
      // where that node would stand had it gone since.
      const start = after === undefined ? 0 : tree.findIndex((n) => treeOrder(n.path, after) > 0);
      const page = pageOf(start < 0 ? [] : tree.slice(start, start + size + 1), size, (n) =>
        byKey(n.path),
      );
      return {
        shares: page.rows.map(toShare),
        halfLifeSeconds: app.config.shareHalfLifeMs / 1000,
        nextPageToken: page.next,
      };
    },
  };
}

function toRate(r: RateRow): RateLimit {
  return create(RateLimitSchema, {
    key: r.key,
    perSecond: r.perSecond,
    burst: r.burst,
    tokens: r.tokens,
    updatedAt: timestampFromDate(r.refilledAt),
  });
}

function toLimit(r: LimitRow): ConcurrencyLimit {
  return create(ConcurrencyLimitSchema, { ...r, pending: BigInt(r.pending) });
}

/** A limit key (concurrency_key, rate_key): required here. */
const keyField = (value: string) => limitKey("key", value, { required: true });

/** ConcurrencyService: limits and rates by key. */
export function createConcurrencyService(
  app: Pick<SchedulingServiceDeps, "scheduling">,
): ServiceImpl<typeof ConcurrencyService> {
  const store = app.scheduling;
  return {
    async setLimit(req) {
      const key = keyField(req.key);
      await store.setLimit(key, intInRange("max_running", req.maxRunning, 0, 1_000_000));
      const [limit] = await store.limits({ key });
      if (!limit) throw new Error("a limit just set was not read back");
      return { limit: toLimit(limit) };
    },

    async deleteLimit(req) {
      return { deleted: await store.deleteLimit(keyField(req.key)) };
    },

    async listLimits(req) {
      const size = pageSize(req.pageSize);
      const rows = await store.limits({ after: decodeKeyCursor(req.pageToken), size: size + 1 });
      const page = pageOf(rows, size, (r) => byKey(r.key));
      return { limits: page.rows.map(toLimit), nextPageToken: page.next };
    },

    async setRate(req) {
      const key = keyField(req.key);
      const perSecond = req.perSecond;
      if (!(Number.isFinite(perSecond) && perSecond > 0 && perSecond <= 1_000_000)) {
        throw invalid(`per_second must be above 0 and at most 1000000, not ${perSecond}`);
      }
      const burst =
        req.burst === undefined
          ? Math.max(1, Math.ceil(perSecond))
          : intInRange("burst", req.burst, 1, 1_000_000);
      await store.setRate(key, perSecond, burst);
      const [rate] = await store.rates({ key });
      if (!rate) throw new Error("a rate just set was not read back");
      return { rate: toRate(rate) };
    },

    async deleteRate(req) {
      return { deleted: await store.deleteRate(keyField(req.key)) };
    },

    async listRates(req) {
      const size = pageSize(req.pageSize);
      const rows = await store.rates({ after: decodeKeyCursor(req.pageToken), size: size + 1 });
      const page = pageOf(rows, size, (r) => byKey(r.key));
      return { rates: page.rows.map(toRate), nextPageToken: page.next };
    },
  };
}
