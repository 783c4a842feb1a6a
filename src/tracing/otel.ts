import { AsyncLocalStorage } from "node:async_hooks";
import {
  type Context,
  context as otelContext,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  TraceFlags,
  trace,
} from "@opentelemetry/api";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor, type SpanExporter } from "@opentelemetry/sdk-trace-base";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";
import type { StatementObserver } from "../db/observe.js";
import type { TraceContext } from "./context.js";
import type { RpcSpan, Tracing } from "./tracing.js";

/**
 * The gRPC status code of each Connect code name, for `rpc.grpc.status_code`
 * (Connect's codes are gRPC's, by number).
 */
const grpcCodes: Record<string, number> = {
  ok: 0,
  canceled: 1,
  unknown: 2,
  invalid_argument: 3,
  deadline_exceeded: 4,
  not_found: 5,
  already_exists: 6,
  permission_denied: 7,
  resource_exhausted: 8,
  failed_precondition: 9,
  aborted: 10,
  out_of_range: 11,
  unimplemented: 12,
  internal: 13,
  unavailable: 14,
  data_loss: 15,
  unauthenticated: 16,
};

/**
 * Codes that say the server failed (OpenTelemetry's RPC conventions): the
 * others are the caller's mistakes and leave a server span's status unset.
 */
const serverErrors = new Set([
  "unknown",
  "deadline_exceeded",
  "unimplemented",
  "internal",
  "unavailable",
  "data_loss",
]);

/**
 * Span export through OpenTelemetry: a NodeTracerProvider with a batch
 * processor and an OTLP/HTTP exporter (JSON) sending to
 * `<endpoint>/v1/traces`, resource `service.name` "meshwork". Imported only
 * by loadTracing (tracing/load.ts), with `--otel-endpoint` set.
 *
 * Nothing global is set (no `register()`): the spans' parents travel in an
 * AsyncLocalStorage of this module, from the RPC span (run around its
 * handler) to the statements the handler makes. `exporter` is for tests.
 */
export function createOtelTracing(endpoint: string, exporter?: SpanExporter): Tracing {
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({ "service.name": "meshwork" }),
    spanProcessors: [
      new BatchSpanProcessor(exporter ?? new OTLPTraceExporter({ url: `${endpoint}/v1/traces` })),
    ],
  });
  const tracer = provider.getTracer("meshwork");
  const current = new AsyncLocalStorage<Context>();

  /** The caller's span as the parent context, or none for a trace begun here. */
  const parentOf = (t: TraceContext): Context =>
    t.parentSpanId === ""
      ? ROOT_CONTEXT
      : trace.setSpanContext(ROOT_CONTEXT, {
          traceId: t.traceId,
          spanId: t.parentSpanId,
          traceFlags: Number.parseInt(t.flags, 16) & TraceFlags.SAMPLED,
          isRemote: true,
        });

  const statements: StatementObserver = {
    started(statement) {
      const parent = current.getStore();
      // A statement outside any RPC (the sweeper, retention) is no span:
      // each would be a trace of its own, every second.
      if (parent === undefined) return () => {};
      const span = tracer.startSpan(
        statement,
        {
          kind: SpanKind.CLIENT,
          // The statement's short name only: never its SQL text or parameters.
          attributes: { "db.system": "postgresql", "db.operation.name": statement },
        },
        parent,
      );
      return (error) => {
        if (error !== undefined) {
          span.setStatus({ code: SpanStatusCode.ERROR });
          const code = (error as { code?: unknown }).code;
          if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code)) {
            span.setAttribute("db.response.status_code", code);
          }
        }
        span.end();
      };
    },
  };

  return {
    startRpc(service, method, t, system): RpcSpan {
      const span: Span = tracer.startSpan(
        `${service}/${method}`,
        {
          kind: SpanKind.SERVER,
          attributes: { "rpc.system": system, "rpc.service": service, "rpc.method": method },
        },
        parentOf(t),
      );
      const ctx = span.spanContext();
      const active = trace.setSpan(otelContext.active(), span);
      return {
        traceId: ctx.traceId,
        spanId: ctx.spanId,
        sampled: (ctx.traceFlags & TraceFlags.SAMPLED) !== 0,
        run: (fn) => current.run(active, fn),
        end(code) {
          if (code !== "ok") span.setAttribute("rpc.connect_rpc.error_code", code);
          span.setAttribute("rpc.grpc.status_code", grpcCodes[code] ?? 2);
          if (serverErrors.has(code)) span.setStatus({ code: SpanStatusCode.ERROR, message: code });
          span.end();
        },
      };
    },
    statements,
    async shutdown() {
      // A collector that does not answer holds the exit back 5 s at most.
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, 5000);
      });
      await Promise.race([provider.shutdown(), late]).finally(() => clearTimeout(timer));
    },
  };
}
