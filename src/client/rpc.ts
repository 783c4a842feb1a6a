import { Code, ConnectError, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { context, isSpanContextValid, trace } from "@opentelemetry/api";
import { ErrorInfoSchema } from "../../gen/meshwork/v1/errors_pb.js";

// The client's plumbing: the transport, its headers (token, correlation id,
// W3C trace context) and its retries. The client is a leaf (it imports only
// gen/ and npm packages, never the coordinator nor the worker SDK), so it
// carries these few helpers itself; sdk/rpc.ts has their worker-side twins.

/** How the client retries a call the coordinator answered `unavailable`. */
export interface RetryOptions {
  /** Tries in all, the first included (default 6; 1 turns retries off). */
  maxAttempts?: number;
  /** The wait before the second try (default 250 ms); it doubles each time, with jitter. */
  initialDelayMs?: number;
  /** The longest wait between two tries (default 10 s). */
  maxDelayMs?: number;
}

/** What the transport needs from ClientOptions (see index.ts for each field). */
export interface TransportOptions {
  baseUrl: string;
  token?: string;
  transport?: "connect" | "grpc";
  correlationId?: string;
  headers?: Record<string, string>;
  retry?: RetryOptions;
  interceptors?: Interceptor[];
}

/**
 * A coordinator URL, checked: http:// or https:// and a host. A URL without
 * a scheme (`127.0.0.1:8080`) is refused with one line that says what to
 * write instead.
 */
export function checkedUrl(url: string): string {
  if (!/^https?:\/\//i.test(url)) {
    throw new TypeError(
      `baseUrl must start with http:// or https://, not ${JSON.stringify(url.slice(0, 200))} (try ${JSON.stringify(`http://${url.replace(/^[a-z]+:\/*/i, "").slice(0, 200)}`)})`,
    );
  }
  try {
    new URL(url);
  } catch {
    throw new TypeError(`baseUrl is not a valid URL: ${JSON.stringify(url.slice(0, 200))}`);
  }
  return url;
}

/**
 * The transport every call of a client goes through. Interceptors, outermost
 * first: the trace context (one per logical call, kept across its retries),
 * the retries, the fixed headers (token, correlation id, `headers`), then the
 * caller's own.
 */
export function clientTransport(o: TransportOptions): Transport {
  checkedUrl(o.baseUrl);
  const fixed: Interceptor = (next) => (req) => {
    for (const [name, value] of Object.entries(o.headers ?? {})) {
      if (!req.header.has(name)) req.header.set(name, value);
    }
    if (o.token) req.header.set("authorization", `Bearer ${o.token}`);
    if (o.correlationId && !req.header.has("x-correlation-id")) {
      req.header.set("x-correlation-id", o.correlationId);
    }
    return next(req);
  };
  const interceptors = [
    traceInterceptor,
    retryInterceptor(o.retry),
    fixed,
    ...(o.interceptors ?? []),
  ];
  return o.transport === "grpc"
    ? createGrpcTransport({ baseUrl: o.baseUrl, interceptors })
    : createConnectTransport({ baseUrl: o.baseUrl, httpVersion: "1.1", interceptors });
}

/**
 * Sets the W3C `traceparent` (and `tracestate`) of a call that has none: the
 * active OpenTelemetry span's context when there is one, so that the
 * coordinator's spans join the caller's trace, else a new sampled trace. The
 * coordinator stores it on the tasks the call creates (Task.traceparent), and
 * hands it to the worker that claims them, as the worker SDK passes it on.
 */
const traceInterceptor: Interceptor = (next) => (req) => {
  if (!req.header.has("traceparent")) {
    const { traceparent, tracestate } = currentTrace();
    req.header.set("traceparent", traceparent);
    if (tracestate) req.header.set("tracestate", tracestate);
  }
  return next(req);
};

/** The trace context to send: the active span's, or a new trace. */
export function currentTrace(): { traceparent: string; tracestate?: string } {
  const span = trace.getSpanContext(context.active());
  if (span && isSpanContextValid(span)) {
    const flags = (span.traceFlags & 0xff).toString(16).padStart(2, "0");
    return {
      traceparent: `00-${span.traceId}-${span.spanId}-${flags}`,
      tracestate: span.traceState?.serialize() || undefined,
    };
  }
  return { traceparent: `00-${randomHex(16)}-${randomHex(8)}-01` };
}

function randomHex(bytes: number): string {
  const b = globalThis.crypto.getRandomValues(new Uint8Array(bytes));
  const hex = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  // All zeros is invalid in W3C trace context; 2^-64 at worst, but cheap to rule out.
  return /^0+$/.test(hex) ? randomHex(bytes) : hex;
}

/**
 * The calls a retry could do twice: an `unavailable` may come after the
 * coordinator acted (a connection dropped before the answer), and these
 * carry no idempotency key that would make a second one harmless (a trigger
 * makes a second task; a cancel, rerun or delete sent again is refused as
 * if it had not happened). They are sent once; the caller decides.
 */
const notRepeatable = new Set([
  "TriggerSchedule",
  "DeleteSchedule",
  "CancelTask",
  "CancelTasks",
  "RerunTask",
  "RerunTasks",
  "ScheduleTask",
  "RetryTask",
]);

/** Retries a unary call while it fails with `unavailable`, and on no other code. */
function retryInterceptor(options: RetryOptions = {}): Interceptor {
  const tries = Math.max(1, options.maxAttempts ?? 6);
  return (next) => async (req) => {
    // A stream cannot be replayed from here: result() and followLogs()
    // reconnect themselves, from where they were.
    if (req.stream || notRepeatable.has(req.method.name)) return next(req);
    for (let attempt = 1; ; attempt++) {
      try {
        return await next(req);
      } catch (error) {
        if (!isUnavailable(error) || attempt >= tries || req.signal.aborted) throw error;
        await sleep(backoffMs(attempt, options), req.signal);
        if (req.signal.aborted) throw ConnectError.from(req.signal.reason, Code.Canceled);
      }
    }
  };
}

/** Whether the coordinator (or the way to it) was unavailable: the one code worth trying again. */
export function isUnavailable(error: unknown): boolean {
  return error instanceof ConnectError && error.code === Code.Unavailable;
}

/**
 * Whether a stream broke without an answer from the coordinator: `unavailable`,
 * or a connection that dropped (`aborted` with no ErrorInfo, which the
 * coordinator always attaches to its own refusals). A read-only stream is
 * safe to open again after either.
 */
export function isBrokenStream(error: unknown): boolean {
  if (isUnavailable(error)) return true;
  return (
    error instanceof ConnectError &&
    error.code === Code.Aborted &&
    error.findDetails(ErrorInfoSchema).length === 0
  );
}

/** The wait before try `attempt + 1`: exponential, capped, with jitter (half to all of it). */
export function backoffMs(attempt: number, options: RetryOptions = {}): number {
  const initial = options.initialDelayMs ?? 250;
  const max = options.maxDelayMs ?? 10_000;
  const base = Math.min(max, initial * 2 ** Math.max(0, attempt - 1));
  return base / 2 + Math.random() * (base / 2);
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
