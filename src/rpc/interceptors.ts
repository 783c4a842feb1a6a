import {
  Code,
  ConnectError,
  type Interceptor,
  type StreamRequest,
  type UnaryRequest,
} from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import { kCorrelationId, kTrace } from "../core/context.js";
import { DomainError } from "../core/errors.js";
import { refuseUnstorableText } from "../core/validate.js";
import type { Logger } from "../log.js";
import { newSpanId, type TraceContext, traceFromHeaders } from "../tracing/context.js";
import type { Tracing } from "../tracing/tracing.js";
import type { ToClientError } from "./errors.js";

/**
 * Logs every RPC with its correlation id, trace and span ids, method, code
 * and duration, and
 * turns whatever a handler throws into what a client may see (`toClientError`,
 * from rpc/errors.ts):
 * store refusals keep their code and reason, anything unexpected becomes
 * `internal error` and is logged in full, never sent. Streaming responses
 * are wrapped too, since their errors surface while the stream is read.
 *
 * The call's trace context (context.ts kTrace, set from `traceparent` by
 * server.ts, or read here from the call's headers on in-memory transports)
 * gets the call's span: with `tracing` (spans exported), the OpenTelemetry
 * server span, run around the handler so that statement spans are its
 * children, and ended with the call's code.
 */
export function createRpcInterceptor(
  log: Logger,
  toClientError: ToClientError,
  tracing?: Tracing,
): Interceptor {
  return (next) => async (req) => {
    const started = performance.now();
    const incoming =
      req.contextValues.get(kTrace) ??
      traceFromHeaders(
        req.header.get("traceparent") ?? undefined,
        req.header.get("tracestate") ?? undefined,
      );
    const span = tracing?.startRpc(
      req.service.typeName,
      req.method.name,
      incoming,
      req.header.get("content-type")?.startsWith("application/grpc") ? "grpc" : "connect_rpc",
    );
    const trace: TraceContext = span
      ? {
          ...incoming,
          traceId: span.traceId,
          spanId: span.spanId,
          // A trace begun here is sampled when its span is recorded.
          flags: incoming.parentSpanId ? incoming.flags : span.sampled ? "01" : "00",
        }
      : // A span id of the call's own: the REST routes make several calls per request.
        { ...incoming, spanId: newSpanId() };
    req.contextValues.set(kTrace, trace);
    // The call's logger is made only when a line is written: a child
    // logger serializes its fields up front, which cost more than the rest
    // of this interceptor on a call that logs nothing (every successful
    // call below --log-level debug).
    let callLog: Logger | undefined;
    const rpcLog = () =>
      (callLog ??= log.child({
        correlation_id: req.contextValues.get(kCorrelationId),
        trace_id: trace.traceId,
        span_id: trace.spanId,
        rpc: `${req.service.typeName}/${req.method.name}`,
      }));
    const finish = (error: unknown) => {
      const ms = Math.round((performance.now() - started) * 10) / 10;
      if (error === undefined) {
        span?.end("ok");
        if (log.isLevelEnabled("debug")) rpcLog().debug({ code: "ok", ms }, "rpc");
        return undefined;
      }
      if (req.signal.aborted || clientLeft(error)) {
        // The client cancelled, went away or let its deadline pass: normal,
        // and nobody is left to tell. One line, no stack.
        const code =
          req.signal.reason instanceof ConnectError ? req.signal.reason.code : Code.Canceled;
        span?.end(codeToString(code));
        if (log.isLevelEnabled("debug")) {
          rpcLog().debug({ code: codeToString(code), ms }, "rpc ended: the client went away");
        }
        return new ConnectError("the client went away", code);
      }
      const mapped = toClientError(error);
      span?.end(codeToString(mapped.error.code));
      if (mapped.unexpected) rpcLog().error({ err: error, code: "internal", ms }, "rpc failed");
      else if (mapped.error.code === Code.Unavailable)
        rpcLog().warn({ err: error, code: "unavailable", ms }, "rpc failed: unavailable");
      else if (error instanceof DomainError && error.reason === "STORAGE_FULL")
        rpcLog().warn(
          { code: "resource_exhausted", reason: "STORAGE_FULL", ms },
          "rpc refused: the storage is full",
        );
      else
        rpcLog().info({ code: mapped.error.code, reason: mapped.error.message, ms }, "rpc refused");
      return mapped.error;
    };
    let res: Awaited<ReturnType<typeof next>>;
    try {
      res = await (span ? span.run(() => next(req)) : next(req));
    } catch (error) {
      throw finish(error);
    }
    if (!res.stream) {
      finish(undefined);
      return res;
    }
    const messages = res.message;
    return {
      ...res,
      message: (async function* () {
        try {
          yield* messages;
        } catch (error) {
          throw finish(error);
        }
        finish(undefined);
      })(),
    } as typeof res;
  };
}

/** Node's errors for writing to a stream or socket the client has closed. */
const clientGoneCodes = new Set([
  "ERR_HTTP2_INVALID_STREAM",
  "ERR_HTTP2_STREAM_ERROR",
  "ERR_STREAM_DESTROYED",
  "ERR_STREAM_PREMATURE_CLOSE",
  "ERR_STREAM_WRITE_AFTER_END",
  "EPIPE",
  "ECONNRESET",
]);

/** Whether `error` says the response could not be written because the client went away. */
function clientLeft(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" && clientGoneCodes.has(code);
}

/**
 * Refuses a request message holding a string with U+0000 or a lone
 * surrogate (core/validate.ts, unstorableText) with `invalid_argument`,
 * before the handler sees it: PostgreSQL cannot store such a string, and
 * the statement would fail as an unexpected error. Every message of a
 * stream is checked as it arrives.
 */
export function createNulInterceptor(): Interceptor {
  return (next) => async (req) => next(await checkEachMessage(req, refuseUnstorableText));
}

/**
 * Runs `check` on a request's message before the handler sees it: at once
 * for a unary call, on each message of a stream as it arrives. The request
 * to pass on is returned (a stream's messages wrapped).
 */
export async function checkEachMessage<R extends UnaryRequest | StreamRequest>(
  req: R,
  check: (message: unknown) => unknown,
): Promise<R> {
  if (!req.stream) {
    await check(req.message);
    return req;
  }
  const messages = req.message;
  return {
    ...req,
    message: (async function* () {
      for await (const m of messages) {
        await check(m);
        yield m;
      }
    })(),
  };
}
