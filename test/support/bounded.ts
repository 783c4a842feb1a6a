import { Code } from "@connectrpc/connect";

/**
 * `work`'s result, or "timed out" when it has not settled within `ms`. A
 * bound so that a test fails instead of hanging when a call blocks, not a
 * performance assertion: pick `ms` generously.
 */
export async function within<T>(ms: number, work: Promise<T>): Promise<T | "timed out"> {
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<"timed out">((resolve) => {
    timer = setTimeout(() => resolve("timed out"), ms);
  });
  try {
    return await Promise.race([work, bound]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Resolves once `check` returns true, polled every 100 ms; throws after
 * `ms`. Like `within`, a bound against hanging, not a timing assertion.
 */
export async function until(check: () => boolean | Promise<boolean>, ms = 15_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`not true within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * `call`, made again after a second while it fails with `unavailable` (the
 * coordinator's "retry in a second": under load, requests waiting on one
 * worker's lock can take every pool connection), as a client does, at
 * most `times` times. Any other error, or the last one, is thrown.
 */
export async function againWhileUnavailable<T>(call: () => Promise<T>, times = 10): Promise<T> {
  for (let i = 1; ; i++) {
    try {
      return await call();
    } catch (error) {
      if (i >= times || (error as { code?: unknown }).code !== Code.Unavailable) throw error;
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
}
