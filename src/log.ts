import { type Logger, pino } from "pino";
import { causeChain } from "./db/faults.js";
import { statementName } from "./db/observe.js";

export type { Logger };

/** Keys of an error (or its causes) that may hold a statement's parameters or row values. */
const unsafeKeys = new Set(["params", "parameters", "detail", "where", "query_params"]);

/**
 * An error as logged. A failed statement is logged as its error class, the
 * SQLSTATE (or the driver's connection error code), the statement's name
 * (`update tasks`, `select meshwork_claim`) and the database's message,
 * never the SQL text or its parameters: those hold lease tokens and users'
 * payloads (and made lines of tens of kilobytes). Any other error goes
 * through pino's serializer without the keys that may carry parameters
 * (Drizzle's `params`, PostgreSQL's `detail`, which may quote row values).
 */
export function safeError(error: unknown): unknown {
  return failedStatement(error) ?? scrub(pino.stdSerializers.err(error as Error), 0);
}

/** The loggable facts of a failed statement, or undefined if `error` is not one. */
function failedStatement(error: unknown): Record<string, unknown> | undefined {
  let query: string | undefined;
  let code: string | undefined;
  let driverMessage: string | undefined;
  for (const o of causeChain(error)) {
    if (query === undefined && typeof o.query === "string") query = o.query;
    if (code === undefined && typeof o.code === "string") {
      code = o.code;
      if (typeof o.message === "string") driverMessage = o.message;
    }
  }
  if (query === undefined) return undefined;
  const statement = statementName(query);
  const sqlstate = code !== undefined && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
  const message = redactValues(driverMessage ?? "no message", sqlstate);
  const top = error as { name?: unknown; stack?: unknown };
  const type = typeof top.name === "string" ? top.name : "Error";
  const frames =
    typeof top.stack === "string"
      ? top.stack
          .split("\n")
          .filter((line) => line.startsWith("    at "))
          .join("\n")
      : "";
  return {
    type,
    message: `${statement} failed: ${message}`,
    statement,
    ...(sqlstate !== undefined ? { sqlstate } : code !== undefined ? { code } : {}),
    stack: `${type}: ${statement} failed: ${message}\n${frames}`,
  };
}

/**
 * A data or constraint error (SQLSTATE class 22 or 23) may quote the value
 * it refused (`invalid input syntax for type uuid: "…"`): quoted text goes.
 */
function redactValues(message: string, sqlstate: string | undefined): string {
  const short = message.length > 300 ? `${message.slice(0, 300)}…` : message;
  if (sqlstate === undefined || !/^2[23]/.test(sqlstate)) return short;
  return short.replace(/"[^"]*"/g, '"…"');
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
