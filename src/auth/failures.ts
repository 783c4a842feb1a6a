import { createRateLimiter } from "./rate-limit.js";

/** Seconds a source's failures are gathered into one log line. */
const windowMs = 10_000;
/** Sources whose failures are gathered at once; beyond it they are told as one line for all. */
const maxSources = 1000;

interface Tally {
  started: number;
  count: number;
  throttled: number;
  why: Set<string>;
}

/**
 * Failed authentications per source address: a token bucket each (`rate` a
 * second, `burst` at once; rate 0 = never throttled), and a log that cannot
 * be flooded. The first failure of a source is logged at once; the ones that
 * follow within ten seconds are counted and told in one line at the end of
 * the window ("37 failed authentications from 127.0.0.2 in 10 s"), so a
 * flood writes a line per source per ten seconds, never one per request.
 */
export function createAuthFailures(options: {
  rate: number;
  burst: number;
  log?: { info(obj: object, msg: string): void } | undefined;
  now?: () => number;
}) {
  const now = options.now ?? (() => performance.now());
  const buckets = createRateLimiter(options.rate, options.burst, now);
  const tallies = new Map<string, Tally>();
  let overflow = 0;

  function tell(source: string, t: Tally): void {
    if (t.count <= 1) return;
    options.log?.info(
      {
        peer: source,
        failures: t.count - 1,
        throttled: t.throttled,
        why: [...t.why].sort(),
        seconds: Math.round((now() - t.started) / 1000),
      },
      "more failed authentications",
    );
  }

  function flush(): void {
    for (const [source, t] of tallies) tell(source, t);
    tallies.clear();
    if (overflow > 0) {
      options.log?.info({ failures: overflow }, "failed authentications from other addresses");
      overflow = 0;
    }
  }

  let timer: NodeJS.Timeout | undefined;
  function arm(): void {
    if (timer || !options.log) return;
    timer = setTimeout(() => {
      timer = undefined;
      const t = now();
      for (const [source, tally] of tallies) {
        if (t - tally.started >= windowMs) {
          tell(source, tally);
          tallies.delete(source);
        }
      }
      if (tallies.size > 0 || overflow > 0) {
        if (tallies.size === 0) flush();
        else arm();
      }
    }, windowMs);
    timer.unref();
  }

  return {
    /** Milliseconds until `source` may fail again (0: it may now; always 0 without a source). */
    throttled(source: string | undefined): number {
      if (source === undefined || options.rate === 0) return 0;
      return buckets.peek(source);
    },

    /**
     * Charges `source` for a token lookup before it runs, so that lookups
     * made at once cannot overdraw the budget; 0 when it may, else the
     * milliseconds to wait. A lookup that finds a valid token is refunded.
     */
    charge(source: string | undefined): number {
      if (source === undefined || options.rate === 0) return 0;
      return buckets.take(source);
    },
    refund(source: string | undefined): void {
      if (source !== undefined && options.rate > 0) buckets.give(source);
    },

    /**
     * Counts a failure of `source` (a throttled request counts too) and logs
     * it as told above; `charged` when `charge` took it already.
     */
    record(source: string | undefined, why: string, charged = false): void {
      if (source === undefined) return;
      if (options.rate > 0 && !charged) buckets.take(source);
      const t = tallies.get(source);
      if (t) {
        t.count++;
        if (why === "throttled") t.throttled++;
        t.why.add(why);
        return;
      }
      if (tallies.size >= maxSources) {
        overflow++;
        return;
      }
      tallies.set(source, {
        started: now(),
        count: 1,
        throttled: why === "throttled" ? 1 : 0,
        why: new Set([why]),
      });
      options.log?.info({ peer: source, why }, "authentication failed");
      arm();
    },

    /** Tells what is still being gathered (at shutdown). */
    flush(): void {
      clearTimeout(timer);
      timer = undefined;
      flush();
    },
  };
}
