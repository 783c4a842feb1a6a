import { type Logger, pino } from "pino";

export type { Logger };

/** Keys of an error (or its causes) that may hold a statement's parameters or row values. */
const unsafeKeys = new Set(["params", "parameters", "detail", "where", "query_params"]);

/**
 * An error as logged: pino's serializer, then without anything that may
 * carry a statement's parameters (Drizzle puts them in `params` and after
 * "params:" in its message; PostgreSQL's `detail` may quote row values).
 * The SQL text itself has placeholders only and is kept.
 */
export function safeError(error: unknown): unknown {
  return scrub(pino.stdSerializers.err(error as Error), 0);
}

function scrub(value: unknown, depth: number): unknown {
  if (depth > 5 || value === null || typeof value !== "object") return value;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    if (unsafeKeys.has(k)) continue;
    if ((k === "message" || k === "stack") && typeof v === "string") {
      out[k] = v.replace(/\nparams: [^\n]*/g, "\nparams: [not logged]");
      continue;
    }
    out[k] = scrub(v, depth + 1);
  }
  return out;
}

/** Structured JSON logs, one object per line, on stdout unless another destination is given. */
export function createLogger(level: string, destination?: pino.DestinationStream): Logger {
  const options: pino.LoggerOptions = {
    level,
    base: { service: "meshwork" },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label) => ({ level: label }) },
    serializers: { err: safeError },
  };
  return destination ? pino(options, destination) : pino(options);
}
