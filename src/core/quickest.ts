/**
 * The quickest of the last `n` durations recorded, for a budget timed from
 * them (the claim hint's life, the share book's read interval): one slow
 * run (a lock, a stall) does not stretch the budget.
 */
export function quickestOfLast(n: number) {
  const last: number[] = [];
  return {
    add(ms: number): void {
      last.push(ms);
      if (last.length > n) last.shift();
    },
    /** The quickest, in ms; 0 before the first. */
    ms(): number {
      return last.length > 0 ? Math.min(...last) : 0;
    },
  };
}
