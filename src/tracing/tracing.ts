import type { StatementObserver } from "../db/observe.js";
import type { TraceContext } from "./context.js";

/** `rpc.system` as OpenTelemetry's conventions name it. */
export type RpcSystem = "grpc" | "connect_rpc";

/**
 * The server span of one RPC, as the interceptor sees it. Made by
 * tracing/otel.ts when spans are exported; nothing makes one otherwise.
 */
export interface RpcSpan {
  /** The span's trace id: the caller's when it sent one. */
  traceId: string;
  /** The span's id. */
  spanId: string;
  /** Whether the span is recorded (and so exported). */
  sampled: boolean;
  /** Runs `fn` with this span current: statement spans started inside it are its children. */
  run<T>(fn: () => T): T;
  /** Ends the span with the call's code ("ok", "not_found", …, Connect's names). */
  end(code: string): void;
}

/**
 * Span export (OpenTelemetry), loaded only with `--otel-endpoint`
 * (tracing/otel.ts, loadTracing). This interface names no OpenTelemetry
 * type: the modules that use it import nothing of OpenTelemetry.
 */
export interface Tracing {
  /**
   * Starts the server span of an RPC, the child of the caller's span when it
   * sent one. `system` is how it was called: "grpc" (gRPC, gRPC-Web) or
   * "connect_rpc" (Connect, and the REST routes' in-process calls).
   */
  startRpc(service: string, method: string, trace: TraceContext, system: RpcSystem): RpcSpan;
  /** Makes a client span per database statement, a child of the current RPC span. */
  statements: StatementObserver;
  /** Exports what is buffered and stops. */
  shutdown(): Promise<void>;
}
