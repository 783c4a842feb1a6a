import { createHmac, timingSafeEqual } from "node:crypto";

// What a push worker receives (docs/SPEC §14): the body the coordinator
// POSTs to `{api_base_url}{dispatch_path}` and its X-Meshwork-Signature
// header, `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
// Exported by worker.ts (meshwork/worker) for receivers of one's own.

/** The header that signs a dispatch. */
export const signatureHeader = "x-meshwork-signature";

/** How far a signature's timestamp may lie from the receiver's clock, either way: 5 minutes. */
export const signatureToleranceSeconds = 300;

/** The JSON body of a dispatch, as the coordinator sends it. */
export interface DispatchBody {
  taskId: string;
  attempt: number;
  leaseToken: string;
  /** RFC 3339. */
  leaseExpiresAt: string;
  workload: string;
  parameters: Record<string, unknown>;
  input: { uri: string; sha256: string } | null;
  correlationId: string;
  traceparent: string;
  coordinatorUrl: string;
}

/**
 * The X-Meshwork-Signature value of `body` (the exact bytes sent) at `t`
 * (unix seconds; default now): what the coordinator sends, and what a test
 * of a receiver sends in its place.
 */
export function signDispatch(
  secret: string,
  body: string | Uint8Array,
  t = Math.floor(Date.now() / 1000),
): string {
  return `t=${t},v1=${mac(secret, String(t), body).toString("hex")}`;
}

function mac(secret: string, t: string, body: string | Uint8Array): Buffer {
  return createHmac("sha256", secret).update(`${t}.`).update(body).digest();
}

/**
 * Checks a dispatch's X-Meshwork-Signature against the exact body bytes:
 * undefined when it holds, else why not (for a 401 and the log). The
 * timestamp must be within `toleranceSeconds` of `nowSeconds` either way
 * (a replay later is refused), and one `v1` must equal the HMAC, compared
 * in constant time (several `v1` are allowed, as while a secret changes).
 */
export function checkDispatchSignature(
  header: string | undefined,
  body: Uint8Array,
  secret: string,
  nowSeconds = Math.floor(Date.now() / 1000),
  toleranceSeconds = signatureToleranceSeconds,
): string | undefined {
  if (!header) return "no X-Meshwork-Signature header";
  // The header's parts, by key: `t=<unix seconds>` and one or more `v1=<hex>`.
  const parts = new Map<string, string[]>();
  for (const part of header.split(",")) {
    const at = part.indexOf("=");
    const key = part.slice(0, at).trim();
    parts.set(key, [...(parts.get(key) ?? []), part.slice(at + 1).trim()]);
  }
  const t = parts.get("t")?.[0] ?? "";
  const signatures = (parts.get("v1") ?? [])
    .filter((v) => /^[0-9a-f]{64}$/i.test(v))
    .map((v) => Buffer.from(v, "hex"));
  if (!/^\d{1,12}$/.test(t)) return "the signature has no timestamp t=<unix seconds>";
  if (Math.abs(nowSeconds - Number(t)) > toleranceSeconds) {
    return `the signature's timestamp is more than ${toleranceSeconds} s from this clock`;
  }
  if (signatures.length === 0) return "the signature has no v1=<hex HMAC-SHA256>";
  const expected = mac(secret, t, body);
  // Every candidate compared, so the time taken tells nothing of which matched.
  let ok = false;
  for (const given of signatures) ok = timingSafeEqual(given, expected) || ok;
  return ok ? undefined : "the signature does not match the body";
}

/** The dispatch in `json`, checked for the fields a receiver needs; else why not. */
export function parseDispatchBody(json: string): DispatchBody | string {
  let body: unknown;
  try {
    body = JSON.parse(json);
  } catch {
    return "the body is not JSON";
  }
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    return "the body is not a JSON object";
  }
  const b = body as Record<string, unknown>;
  const str = (k: string) => (typeof b[k] === "string" ? (b[k] as string) : "");
  if (!str("taskId") || !str("leaseToken")) return "the body has no taskId or leaseToken";
  if (typeof b.attempt !== "number" || !Number.isInteger(b.attempt) || b.attempt < 1) {
    return "the body's attempt is not a positive integer";
  }
  const parameters = b.parameters;
  const input = b.input as DispatchBody["input"] | undefined;
  return {
    taskId: str("taskId"),
    attempt: b.attempt,
    leaseToken: str("leaseToken"),
    leaseExpiresAt: str("leaseExpiresAt"),
    workload: str("workload"),
    parameters:
      parameters && typeof parameters === "object" && !Array.isArray(parameters)
        ? (parameters as Record<string, unknown>)
        : {},
    input: input && typeof input === "object" ? input : null,
    correlationId: str("correlationId"),
    traceparent: str("traceparent"),
    coordinatorUrl: str("coordinatorUrl"),
  };
}
