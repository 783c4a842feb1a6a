import type { Tracing } from "./tracing.js";

/**
 * The span export of `--otel-endpoint` (OTEL_EXPORTER_OTLP_ENDPOINT), or
 * undefined without one. OpenTelemetry's modules are imported here, at run
 * time, and only with an endpoint: a coordinator without one loads none of
 * them (test/e2e/tracing-export.test.ts checks it).
 */
export async function loadTracing(endpoint: string): Promise<Tracing | undefined> {
  if (endpoint === "") return undefined;
  const { createOtelTracing } = await import("./otel.js");
  return createOtelTracing(endpoint);
}
