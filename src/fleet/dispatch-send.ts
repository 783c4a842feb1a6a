import { createHmac } from "node:crypto";
import * as http from "node:http";
import * as https from "node:https";
import { isIP, type LookupFunction } from "node:net";
import type { ArtifactRefJson } from "../db/schema/index.js";
import { type AddressPolicy, literalHost } from "./dispatch-address.js";

/** What one delivery request carries (SPEC §14) and where it goes. */
export interface DispatchTarget {
  taskId: string;
  attempt: number;
  leaseToken: string;
  leaseExpiresAt: Date;
  workload: string;
  parameters: Record<string, unknown> | null;
  input: ArtifactRefJson | null;
  correlationId: string;
  traceparent: string;
  apiBaseUrl: string;
  dispatchPath: string;
  /** Signs the request (X-Meshwork-Signature); null: unsigned. Never logged. */
  secret: string | null;
  /** The address the worker registered from (--dispatch-allow lets it through). */
  registeredFrom: string;
}

/**
 * How a request ended: `accepted` (2xx), `duplicate` (409), `refused`
 * (another 4xx), `failed` (5xx, 1xx, a redirect: never followed),
 * `unreachable` (DNS, connection refused or reset), `timeout`, `forbidden`
 * (an address --dispatch-allow does not allow).
 */
export type DispatchOutcome =
  | "accepted"
  | "duplicate"
  | "refused"
  | "failed"
  | "unreachable"
  | "timeout"
  | "forbidden";

export interface DispatchResult {
  outcome: DispatchOutcome;
  httpStatus: number;
  durationMs: number;
  url: string;
  error: string;
}

/** The JSON body of SPEC §14, in its order. Never a coordinator token. */
export function dispatchBody(t: DispatchTarget, coordinatorUrl: string): string {
  return JSON.stringify({
    taskId: t.taskId,
    attempt: t.attempt,
    leaseToken: t.leaseToken,
    leaseExpiresAt: t.leaseExpiresAt.toISOString(),
    workload: t.workload,
    parameters: t.parameters ?? {},
    input: t.input ? { uri: t.input.uri, sha256: t.input.sha256 } : null,
    correlationId: t.correlationId,
    traceparent: t.traceparent,
    coordinatorUrl,
  });
}

/** `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`. */
export function signature(secret: string, body: string, nowMs = Date.now()): string {
  const t = Math.floor(nowMs / 1000);
  const v1 = createHmac("sha256", secret).update(`${t}.${body}`).digest("hex");
  return `t=${t},v1=${v1}`;
}

/** The URL a dispatch goes to: the path joined under api_base_url's own. */
export function dispatchUrl(apiBaseUrl: string, path: string): URL {
  const url = new URL(apiBaseUrl);
  url.pathname = `${url.pathname.replace(/\/+$/, "")}${path}`;
  url.search = "";
  url.hash = "";
  return url;
}

export interface SendOptions {
  coordinatorUrl: string;
  timeoutMs: number;
  policy: AddressPolicy;
  /** Resolves a name to every address it has (dispatch-address.ts resolveAll). */
  resolve(host: string): Promise<{ address: string; family: number }[]>;
}

/**
 * Sends one delivery request. The host is resolved here and every address
 * checked against --dispatch-allow; the connection goes to the address
 * checked (a lookup that returns it), with the name as Host and TLS server
 * name, so that a name cannot resolve to another address between the
 * check and the connection (DNS rebinding). Redirects are not followed.
 */
export async function sendDispatch(t: DispatchTarget, o: SendOptions): Promise<DispatchResult> {
  const started = performance.now();
  let url: URL;
  try {
    url = dispatchUrl(t.apiBaseUrl, t.dispatchPath);
  } catch {
    return {
      outcome: "refused",
      httpStatus: 0,
      durationMs: 0,
      url: "",
      error: "no valid api_base_url",
    };
  }
  // As logged and kept in the history: without a user name or password
  // the URL may carry (sent to the worker, never written down).
  const bare = new URL(url);
  bare.username = "";
  bare.password = "";
  const shown = bare.toString();
  const end = (outcome: DispatchOutcome, httpStatus: number, error: string): DispatchResult => ({
    outcome,
    httpStatus,
    durationMs: Math.round(performance.now() - started),
    url: shown,
    error,
  });
  let address: { address: string; family: number };
  const literal = literalHost(url);
  if (literal !== undefined) {
    address = { address: literal, family: isIP(literal) };
  } else {
    let found: { address: string; family: number }[];
    try {
      // Within the request's time: a slow resolver must not outlast the
      // replica's hold on the delivery (dispatch.ts), or another replica
      // would send it too.
      found = await Promise.race([
        o.resolve(url.hostname),
        new Promise<never>((_, reject) =>
          setTimeout(
            () => reject(new Error(`no answer within ${o.timeoutMs} ms`)),
            o.timeoutMs,
          ).unref(),
        ),
      ]);
    } catch (error) {
      return end("unreachable", 0, `cannot resolve ${url.hostname}: ${(error as Error).message}`);
    }
    const first = found[0];
    if (!first) return end("unreachable", 0, `${url.hostname} has no address`);
    address = first;
    const barred = found.find((a) => !o.policy.allows(a.address, t.registeredFrom));
    if (barred)
      return end(
        "forbidden",
        0,
        `${url.hostname} resolves to ${barred.address}, which --dispatch-allow does not allow`,
      );
  }
  if (!o.policy.allows(address.address, t.registeredFrom)) {
    return end("forbidden", 0, `${address.address} is not allowed by --dispatch-allow`);
  }
  const body = dispatchBody(t, o.coordinatorUrl);
  const headers: Record<string, string> = {
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(body)),
    "user-agent": "meshwork-dispatch",
  };
  if (t.correlationId !== "") {
    headers["x-correlation-id"] = t.correlationId;
    // The director contract's name for it (rest/director.ts).
    headers["x-ashlar-correlation-id"] = t.correlationId;
  }
  if (t.traceparent !== "") headers.traceparent = t.traceparent;
  if (t.secret !== null) headers["x-meshwork-signature"] = signature(t.secret, body);
  const pinned: LookupFunction = (_host, options, callback) => {
    if (options.all) callback(null, [address]);
    else callback(null, address.address, address.family);
  };
  const transport = url.protocol === "https:" ? https : http;
  return new Promise<DispatchResult>((resolve) => {
    const req = transport.request(
      url,
      {
        method: "POST",
        headers,
        lookup: pinned,
        agent: false,
        timeout: o.timeoutMs,
        ...(url.protocol === "https:" && literal === undefined && { servername: url.hostname }),
      },
      (res) => {
        const status = res.statusCode ?? 0;
        // The answer's body is read and dropped.
        res.on("data", () => {});
        res.on("error", () => {});
        res.on("close", () => {
          clearTimeout(deadline);
          if (!res.complete) {
            resolve(end(timedOut ? "timeout" : "unreachable", status, "the answer was cut off"));
          }
        });
        res.on("end", () => {
          clearTimeout(deadline);
          // The status only: the answer's text of an arbitrary target is not
          // for the history to repeat.
          if (status >= 200 && status < 300) resolve(end("accepted", status, ""));
          else if (status === 409) resolve(end("duplicate", status, ""));
          // Busy (429) or not ready (503): the same worker again, after a backoff.
          else if (status === 429 || status === 503) resolve(end("failed", status, "busy"));
          // A redirect is not followed, and will not change: placed elsewhere.
          else if (status >= 300 && status < 400)
            resolve(end("refused", status, "redirect not followed"));
          else if (status >= 400 && status < 500) resolve(end("refused", status, ""));
          else resolve(end("failed", status, ""));
        });
      },
    );
    // The whole exchange, answer included, within the timeout.
    let timedOut = false;
    const expire = () => {
      timedOut = true;
      req.destroy(new TimeoutError());
    };
    const deadline = setTimeout(expire, o.timeoutMs);
    req.on("timeout", expire);
    req.on("error", (error) => {
      clearTimeout(deadline);
      if (timedOut) resolve(end("timeout", 0, `no answer within ${o.timeoutMs} ms`));
      else resolve(end("unreachable", 0, error.message));
    });
    req.end(body);
  });
}

class TimeoutError extends Error {
  override readonly name = "TimeoutError";
}
