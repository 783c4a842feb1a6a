/**
 * A token bucket per key (a token id): `rate` requests a second on average,
 * up to `burst` at once. Per replica and in memory: with N replicas a token
 * may reach N times the rate, which bounds abuse without shared state.
 */
export function createRateLimiter(rate: number, burst: number, now = () => performance.now()) {
  const buckets = new Map<string, { tokens: number; at: number }>();
  return {
    /** Takes one request; returns 0 when allowed, else the milliseconds until one is. */
    take(key: string): number {
      const t = now();
      const b = buckets.get(key) ?? { tokens: burst, at: t };
      b.tokens = Math.min(burst, b.tokens + ((t - b.at) * rate) / 1000);
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
