/**
 * Group commit for one kind of statement. A call made while no batch is in
 * flight (nor in the event loop's turn after one) runs at once, alone;
 * calls made meanwhile wait and then run together as the next batch. Under
 * load, concurrent callers share statements (one round trip for many);
 * idle, nobody waits for a timer. Each caller gets its own item's outcome.
 * A batch that fails with an error `retryable` says may be retried (the
 * statement must be safe to run again) is run once more before its callers
 * see the failure: one lost connection should not fail every call that
 * happened to share it.
 *
 * `size` weighs an item (1 by default): a batch takes items in order while
 * their sizes add up to at most `maxBatch`, and always at least one.
 */
export function createBatcher<I, O>(
  run: (items: I[]) => Promise<O[]>,
  options: {
    maxBatch?: number;
    size?: (item: I) => number;
    retryable?: (error: unknown) => boolean;
  } = {},
) {
  const maxBatch = options.maxBatch ?? 1000;
  const size = options.size ?? (() => 1);
  const retryable = options.retryable ?? (() => false);

  type Queued = { item: I; resolve: (o: O) => void; reject: (e: unknown) => void };
  let queue: Queued[] = [];
  let flushing = false;

  /** How many queued items, from the first, the next batch takes. */
  function nextCount(): number {
    let total = size((queue[0] as Queued).item);
    let n = 1;
    for (; n < queue.length; n++) {
      total += size((queue[n] as Queued).item);
      if (total > maxBatch) break;
    }
    return n;
  }

  async function flush(): Promise<void> {
    flushing = true;
    while (queue.length > 0) {
      const batch = queue.slice(0, nextCount());
      queue = queue.slice(batch.length);
      try {
        const items = batch.map((b) => b.item);
        const out = await run(items).catch((error: unknown) => {
          if (retryable(error)) return run(items);
          throw error;
        });
        batch.forEach((b, i) => {
          b.resolve(out[i] as O);
        });
      } catch (error) {
        for (const b of batch) b.reject(error);
      }
      // Look at the queue again once the event loop's turn is over. A
      // statement on PGlite runs in this thread and settles without the
      // loop turning: the requests the loop read with the one that started
      // the batch are delivered only after it, and without this each of
      // them would start a batch of its own, alone.
      await new Promise((resolve) => setImmediate(resolve));
    }
    flushing = false;
  }

  return (item: I): Promise<O> =>
    new Promise<O>((resolve, reject) => {
      queue.push({ item, resolve, reject });
      if (!flushing) void flush();
    });
}
