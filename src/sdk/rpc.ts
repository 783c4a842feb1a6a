import { Code, ConnectError, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { ErrorInfoSchema } from "../../gen/meshwork/v1/errors_pb.js";

/**
 * A gRPC transport (HTTP/2: h2c for http:// URLs, TLS for https://) that
 * presents the bearer token on every call. HTTP/2 is what StreamLeases, a
 * bidirectional stream, needs.
 */
/**
 * A coordinator URL, checked: http:// or https:// and a host. A URL without
 * a scheme (`127.0.0.1:8080`) is refused with one line that says what to
 * write instead.
 */
export function checkedUrl(url: string, what = "url"): string {
  if (!/^https?:\/\//i.test(url)) {
    throw new TypeError(
      `${what} must start with http:// or https://, not ${JSON.stringify(url.slice(0, 200))} (try ${JSON.stringify(`http://${url.replace(/^[a-z]+:\/*/i, "").slice(0, 200)}`)})`,
    );
  }
  try {
    new URL(url);
  } catch {
    throw new TypeError(`${what} is not a valid URL: ${JSON.stringify(url.slice(0, 200))}`);
  }
  return url;
}

export function workerTransport(url: string, token: string, extra: Interceptor[] = []): Transport {
  checkedUrl(url);
  const bearer: Interceptor = (next) => (req) => {
    if (token) req.header.set("authorization", `Bearer ${token}`);
    return next(req);
  };
  return createGrpcTransport({ baseUrl: url, interceptors: [bearer, ...extra] });
}

/** The ErrorInfo reason the coordinator attached to an error, or "". */
export function reasonOf(error: unknown): string {
  if (!(error instanceof ConnectError)) return "";
  return error.findDetails(ErrorInfoSchema)[0]?.reason ?? "";
}

/**
 * Whether the coordinator refused a lease-bound call because the lease is no
 * longer this worker's: `aborted` with an ErrorInfo. (A client may report a
 * dropped connection as `aborted` too; only the server sends the detail.)
 */
export function isLeaseRefusal(error: unknown): boolean {
  return (
    error instanceof ConnectError &&
    error.code === Code.Aborted &&
    reasonOf(error) !== "" &&
    reasonOf(error) !== "ARTIFACT_MISMATCH"
  );
}

const transientCodes = new Set([
  Code.Unavailable,
  Code.DeadlineExceeded,
  Code.ResourceExhausted,
  Code.Internal,
  Code.Unknown,
  Code.Canceled,
]);

/** Whether a call may succeed if made again later (a restart, an overload, a dropped connection). */
export function isTransient(error: unknown): boolean {
  if (!(error instanceof ConnectError)) return false;
  if (error.code === Code.Aborted) return reasonOf(error) === ""; // a dropped connection
  return transientCodes.has(error.code) && reasonOf(error) !== "ARTIFACT_TOO_LARGE";
}

/** Resolves after `ms`, or at once when `signal` aborts (never rejects). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** Exponential backoff with jitter: 0.5 s, 1 s, 2 s, … up to `maxMs`. */
export function backoffMs(failures: number, maxMs = 10_000): number {
  const base = Math.min(maxMs, 500 * 2 ** Math.max(0, failures - 1));
  return base / 2 + Math.random() * (base / 2);
}

/**
 * Runs `call`, again after a backoff while it fails transiently, at most
 * `tries` times or until `signal` aborts; the last error is thrown.
 */
export async function retrying<T>(
  call: () => Promise<T>,
  options: {
    tries?: number;
    signal?: AbortSignal;
    /** Gives up once this long has passed since the first try (with the last error). */
    withinMs?: number;
    /** Told of each transient failure that will be tried again, before the wait. */
    onRetry?: (error: unknown, attempt: number, waitMs: number) => void;
  } = {},
): Promise<T> {
  const tries = options.tries ?? 8;
  const started = Date.now();
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (error) {
      if (!isTransient(error) || attempt >= tries || options.signal?.aborted) throw error;
      const wait = backoffMs(attempt);
      if (options.withinMs !== undefined && Date.now() - started + wait > options.withinMs) {
        throw error;
      }
      options.onRetry?.(error, attempt, wait);
      await sleep(wait, options.signal);
    }
  }
}

/** An async iterable fed by `push` and ended by `end`: the requests of a client stream. */
export class Outbox<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private wake: (() => void) | undefined;
  private ended = false;

  push(item: T): void {
    if (this.ended) return;
    this.items.push(item);
    this.wake?.();
  }

  end(): void {
    this.ended = true;
    this.wake?.();
  }

  // A generator, so that the transport can also call return() and throw() on it.
  async *[Symbol.asyncIterator](): AsyncGenerator<T, void, undefined> {
    for (;;) {
      const item = this.items.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      if (this.ended) return;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
      this.wake = undefined;
    }
  }
}
