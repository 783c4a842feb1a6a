/**
 * Group commit for one kind of statement. A call made while no batch is in
 * flight runs at once, alone; calls made while one is in flight wait for it
 * and then run together as the next batch. Under load, concurrent callers
 * share statements (one round trip for many); idle, nobody waits for a
 * timer. Each caller gets its own item's outcome; a failed batch fails each
 * of its callers.
 */
export function createBatcher<I, O>(run: (items: I[]) => Promise<O[]>, maxBatch = 1000) {
  let queue: { item: I; resolve: (o: O) => void; reject: (e: unknown) => void }[] = [];
  let flushing = false;

  async function flush(): Promise<void> {
    flushing = true;
    while (queue.length > 0) {
      const batch = queue.slice(0, maxBatch);
      queue = queue.slice(batch.length);
      try {
        const out = await run(batch.map((b) => b.item));
        batch.forEach((b, i) => {
          b.resolve(out[i] as O);
        });
      } catch (error) {
        for (const b of batch) b.reject(error);
      }
    }
    flushing = false;
  }

  return (item: I): Promise<O> =>
    new Promise<O>((resolve, reject) => {
      queue.push({ item, resolve, reject });
      if (!flushing) void flush();
    });
}
