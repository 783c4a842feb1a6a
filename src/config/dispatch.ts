import { isIP } from "node:net";

/** The dispatch flags (docs/protocol.md#push-placement), read by config.ts. */
export interface DispatchConfig {
  /** Whether a task that does not say is delivered by the coordinator (CreateTaskRequest.dispatch). */
  dispatchDefault: boolean;
  /** Workloads whose tasks that do not say are delivered by the coordinator, whatever dispatchDefault. */
  dispatchWorkloads: string[];
  /** One delivery request's time to answer, in ms. */
  dispatchTimeoutMs: number;
  /** Delivery requests in flight at once, per replica. */
  dispatchConcurrency: number;
  /** CIDR blocks a delivery may reach although private, loopback, link-local or unique-local. */
  dispatchAllow: string[];
}

export const dispatchFlags = {
  "dispatch-default": { type: "string", env: "MESHWORK_DISPATCH_DEFAULT" },
  "dispatch-workloads": { type: "string", env: "MESHWORK_DISPATCH_WORKLOADS" },
  "dispatch-timeout": { type: "string", env: "MESHWORK_DISPATCH_TIMEOUT" },
  "dispatch-concurrency": { type: "string", env: "MESHWORK_DISPATCH_CONCURRENCY" },
  "dispatch-allow": { type: "string", env: "MESHWORK_DISPATCH_ALLOW" },
} as const;

/** Loopback only: a worker on the coordinator's own host. */
export const defaultDispatchAllow = ["127.0.0.0/8", "::1/128"];

/**
 * A CIDR block (`10.0.0.0/8`, `fd00::/8`, or one address) in canonical
 * form `address/prefix`, or undefined when it is not one.
 */
export function parseCidr(v: string): string | undefined {
  const [address = "", prefix, ...rest] = v.trim().split("/");
  const family = isIP(address);
  if (family === 0 || rest.length > 0) return undefined;
  const max = family === 4 ? 32 : 128;
  if (prefix === undefined) return `${address}/${max}`;
  if (!/^\d{1,3}$/.test(prefix) || Number(prefix) > max) return undefined;
  return `${address}/${Number(prefix)}`;
}

/**
 * Reads the dispatch flags; `fail` throws the caller's error type.
 * `--dispatch-allow none` allows no private address at all.
 */
export function readDispatchFlags(
  get: (name: keyof typeof dispatchFlags) => string | undefined,
  fail: (message: string) => never,
): DispatchConfig {
  const onOff = get("dispatch-default") ?? "off";
  if (onOff !== "on" && onOff !== "off") fail("--dispatch-default must be on or off");
  const whole = (name: string, v: string | undefined, dflt: number, min: number, max: number) => {
    if (v === undefined) return dflt;
    const n = Number(v);
    if (!Number.isInteger(n) || n < min || n > max) {
      fail(`${name} must be a whole number from ${min} to ${max}, not ${v}`);
    }
    return n;
  };
  const allow = get("dispatch-allow");
  const blocks =
    allow === undefined
      ? defaultDispatchAllow
      : allow === "none"
        ? []
        : allow
            .split(",")
            .map((b) => parseCidr(b) ?? fail(`--dispatch-allow: ${b} is not a CIDR block`));
  return {
    dispatchDefault: onOff === "on",
    dispatchWorkloads: (get("dispatch-workloads") ?? "")
      .split(",")
      .map((w) => w.trim())
      .filter((w) => w !== ""),
    // Seconds on the command line, like the other timeouts.
    dispatchTimeoutMs: 1000 * whole("--dispatch-timeout", get("dispatch-timeout"), 10, 1, 600),
    dispatchConcurrency: whole("--dispatch-concurrency", get("dispatch-concurrency"), 16, 1, 1000),
    dispatchAllow: blocks,
  };
}
