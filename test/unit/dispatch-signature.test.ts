import { describe, expect, it } from "vitest";
import { dispatchBody, signature } from "../../src/fleet/dispatch-send.js";
import { listenAddress } from "../../src/sdk/push-server.js";
import {
  checkDispatchSignature,
  signatureToleranceSeconds,
  signDispatch,
} from "../../src/sdk/worker.js";

// The receiver's side of X-Meshwork-Signature (SPEC §14) against the
// coordinator's: what the dispatcher signs, the SDK accepts, and nothing else.

const secret = "s".repeat(40);
const body = dispatchBody(
  {
    taskId: "6f1c0000-0000-4000-8000-000000000001",
    attempt: 2,
    leaseToken: "lease",
    leaseExpiresAt: new Date("2026-12-05T12:00:00Z"),
    workload: "render",
    parameters: { frame: 7, name: "é" },
    input: null,
    correlationId: "c-1",
    traceparent: "",
    apiBaseUrl: "http://127.0.0.1:9",
    dispatchPath: "/meshwork/tasks",
    secret,
    registeredFrom: "127.0.0.1",
  },
  "http://127.0.0.1:8080",
);
const bytes = new TextEncoder().encode(body);
const t = 1_800_000_000;

describe("dispatch signatures", () => {
  it("accepts what the coordinator signs, and signs it the same way", () => {
    const header = signature(secret, body, t * 1000);
    expect(signDispatch(secret, body, t)).toBe(header);
    expect(checkDispatchSignature(header, bytes, secret, t)).toBeUndefined();
    // Within the window either way; several v1, one of them right.
    expect(checkDispatchSignature(header, bytes, secret, t + 300)).toBeUndefined();
    expect(checkDispatchSignature(header, bytes, secret, t - 300)).toBeUndefined();
    const rotated = `${header.replace(/v1=\w+/, `v1=${"0".repeat(64)}`)},${header.split(",")[1]}`;
    expect(checkDispatchSignature(rotated, bytes, secret, t)).toBeUndefined();
  });

  it("refuses a missing, malformed, wrong, tampered or stale signature, saying why", () => {
    const header = signDispatch(secret, body, t);
    const check = (h: string | undefined, b = bytes, now = t) =>
      checkDispatchSignature(h, b, secret, now);
    expect(check(undefined)).toMatch(/no X-Meshwork-Signature/);
    expect(check("")).toMatch(/no X-Meshwork-Signature/);
    expect(check(header.replace(/^t=\d+,/, ""))).toMatch(/no timestamp/);
    expect(check(`t=${t}`)).toMatch(/no v1/);
    expect(check(`t=${t},v1=zz`)).toMatch(/no v1/);
    expect(check(signDispatch("w".repeat(40), body, t))).toMatch(/does not match/);
    expect(check(header, new TextEncoder().encode(body.replace("render", "Render")))).toMatch(
      /does not match/,
    );
    // The header's t is signed too: moving it breaks the HMAC.
    expect(check(header.replace(`t=${t}`, `t=${t + 1}`))).toMatch(/does not match/);
    const tooLate = t + signatureToleranceSeconds + 1;
    const tooEarly = t - signatureToleranceSeconds - 1;
    expect(check(header, bytes, tooLate)).toMatch(/more than 300 s/);
    expect(check(header, bytes, tooEarly)).toMatch(/more than 300 s/);
  });

  it("reads listen addresses as HOST:PORT, :PORT, PORT and [IPv6]:PORT", () => {
    expect(listenAddress("127.0.0.1:0")).toEqual({ host: "127.0.0.1", port: 0 });
    expect(listenAddress(":9090")).toEqual({ host: "0.0.0.0", port: 9090 });
    expect(listenAddress("9090")).toEqual({ host: "0.0.0.0", port: 9090 });
    expect(listenAddress("[::1]:80")).toEqual({ host: "::1", port: 80 });
    for (const bad of ["", "host", "1.2.3.4:70000", "http://x:1", "::1:80"]) {
      expect(() => listenAddress(bad), bad).toThrow(TypeError);
    }
  });
});
