import { unauthenticated } from "../core/errors.js";

/** How often the tokens holding open streams are checked: a revocation ends them within a second. */
const checkEveryMs = 500;

/**
 * Ends the streams of revoked tokens. Each open stream (StreamLeases,
 * WatchTask, uploads and downloads, …) is registered under its token; while
 * any is, the tokens that hold them are read every half second (one indexed
 * statement for all of them, `revokedAmong`), and the streams of a token
 * found revoked are aborted with `unauthenticated`. Every replica checks the
 * streams it serves, so a token revoked through any replica loses them all
 * within a second. Unary calls need no help: the guard trusts a lookup for
 * half a second only.
 */
export function createStreamRevocation(options: {
  revokedAmong?: ((tokenIds: string[]) => Promise<string[]>) | undefined;
  log?: { warn(obj: object, msg: string): void } | undefined;
  intervalMs?: number;
}) {
  const open = new Map<string, Set<AbortController>>();
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;

  async function check(): Promise<void> {
    timer = undefined;
    const ids = [...open.keys()];
    if (ids.length === 0 || !options.revokedAmong) return;
    try {
      for (const id of await options.revokedAmong(ids)) {
        const streams = open.get(id);
        open.delete(id);
        for (const c of streams ?? []) c.abort(unauthenticated("the bearer token was revoked"));
      }
    } catch (error) {
      // The next check tries again; a database that cannot answer ends nothing.
      options.log?.warn({ err: error }, "could not check open streams' tokens for revocation");
    }
    arm();
  }

  function arm(): void {
    if (timer || stopped || open.size === 0 || !options.revokedAmong) return;
    timer = setTimeout(() => void check(), options.intervalMs ?? checkEveryMs);
    timer.unref();
  }

  return {
    /** Registers a stream of `tokenId` (null: auth off, never revoked); release it when it ends. */
    watch(tokenId: string | null): { signal: AbortSignal; release(): void } {
      const controller = new AbortController();
      if (tokenId === null) return { signal: controller.signal, release() {} };
      let streams = open.get(tokenId);
      if (!streams) {
        streams = new Set();
        open.set(tokenId, streams);
      }
      streams.add(controller);
      arm();
      return {
        signal: controller.signal,
        release() {
          const set = open.get(tokenId);
          set?.delete(controller);
          if (set?.size === 0) open.delete(tokenId);
        },
      };
    },

    /** Streams registered now (tests). */
    open(): number {
      let n = 0;
      for (const set of open.values()) n += set.size;
      return n;
    },

    stop(): void {
      stopped = true;
      clearTimeout(timer);
    },
  };
}
