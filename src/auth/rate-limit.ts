/**
 * A token bucket per key (a token id): `rate` requests a second on average,
 * up to `burst` at once. Per replica and in memory: with N replicas a token
 * may reach N times the rate, which bounds abuse without shared state.
 */
export function createRateLimiter(rate: number, burst: number, now = () => performance.now()) {
  const buckets = new Map<string, { tokens: number; at: number }>();
  const level = (key: string, t: number) => {
    const b = buckets.get(key);
    return b ? Math.min(burst, b.tokens + ((t - b.at) * rate) / 1000) : burst;
  };
  return {
    /** Milliseconds until `key` may take one (0: now), without taking it. */
    peek(key: string): number {
      const tokens = level(key, now());
      return tokens >= 1 ? 0 : Math.ceil(((1 - tokens) * 1000) / rate);
    },
    /** Gives back one taken (a lookup charged in advance that found a valid token). */
    give(key: string): void {
      const b = buckets.get(key);
      if (b) b.tokens = Math.min(burst, b.tokens + 1);
    },
    /** Takes one request; returns 0 when allowed, else the milliseconds until one is. */
    take(key: string): number {
      const t = now();
      const b = buckets.get(key) ?? { tokens: burst, at: t };
      b.tokens = level(key, t);
      b.at = t;
      if (buckets.size > 100_000 && !buckets.has(key)) buckets.clear();
      buckets.set(key, b);
      if (b.tokens >= 1) {
        b.tokens -= 1;
        return 0;
      }
      return Math.ceil(((1 - b.tokens) * 1000) / rate);
    },
  };
}

export type RateLimiter = ReturnType<typeof createRateLimiter>;
