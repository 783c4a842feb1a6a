import { EventEmitter } from "node:events";
import { describe, expect, it } from "vitest";
import { createAuthFailures } from "../../src/auth/failures.js";
import { createGuard, type GuardOptions } from "../../src/auth/guard.js";
import { digestOf, newSecret } from "../../src/auth/token-store.js";
import { DomainError } from "../../src/core/errors.js";
import type { TokenRow } from "../../src/db/schema/index.js";
import { createTarpit } from "../../src/http/tarpit.js";

/** A guard over an in-memory token table that counts its lookups. */
function guardWith(overrides: Partial<GuardOptions> = {}, lookup?: () => Promise<void>) {
  const rows = new Map<string, TokenRow>();
  const lookups: string[] = [];
  const guard = createGuard({
    enabled: true,
    tokens: {
      async findByDigest(digest) {
        lookups.push(digest);
        await lookup?.();
        return rows.get(digest);
      },
      async touch() {},
    },
    ownerOf: async () => undefined,
    rateLimit: 0,
    rateBurst: 1,
    rateLimitAdmin: false,
    cacheMs: 60_000,
    ...overrides,
  });
  const add = (name: string): string => {
    const secret = newSecret();
    rows.set(digestOf(secret), {
      id: `id-${name}`,
      name,
      role: "client",
      digest: digestOf(secret),
      createdAt: new Date(),
      revokedAt: null,
      lastUsedAt: new Date(),
    } as TokenRow);
    return secret;
  };
  return { guard, lookups, add };
}

const refusal = async (p: Promise<unknown>) => {
  try {
    await p;
    return "ok";
  } catch (error) {
    return error instanceof DomainError ? `${error.kind} ${error.reason}` : String(error);
  }
};

describe("the guard's token lookups", () => {
  it("looks up nothing for a missing header, a malformed one or a value not shaped like a token", async () => {
    const { guard, lookups } = guardWith();
    for (const header of [
      undefined,
      "",
      "Basic abc",
      "Bearer nope",
      `Bearer mw_${"A".repeat(42)}`,
    ]) {
      expect(await refusal(guard.authenticate(header))).toBe("unauthenticated UNAUTHENTICATED");
    }
    expect(lookups).toEqual([]);
  });

  it("looks up an unknown token once, then refuses it from memory; the same digest asked together is one query", async () => {
    const { guard, lookups } = guardWith();
    const unknown = `Bearer ${newSecret()}`;
    await Promise.all([1, 2, 3].map(() => refusal(guard.authenticate(unknown))));
    expect(await refusal(guard.authenticate(unknown))).toBe("unauthenticated UNAUTHENTICATED");
    expect(lookups).toHaveLength(1);
  });

  it("keeps a valid token through a flood of random ones", async () => {
    const { guard, lookups, add } = guardWith();
    const secret = add("kept");
    expect(await refusal(guard.authenticate(`Bearer ${secret}`))).toBe("ok");
    for (let i = 0; i < 12_000; i++) await refusal(guard.authenticate(`Bearer ${newSecret()}`));
    const before = lookups.length;
    expect(await refusal(guard.authenticate(`Bearer ${secret}`))).toBe("ok");
    expect(lookups.length).toBe(before);
  });

  it("refuses a lookup with unavailable while requests waiting for one may buffer more than the cap", async () => {
    let release: () => void = () => {};
    const held = new Promise<void>((r) => {
      release = r;
    });
    const { guard, add } = guardWith({ maxPendingAuthBytes: 100 }, () => held);
    const secret = add("slow");
    const first = refusal(guard.authenticate(`Bearer ${secret}`, { mayBuffer: 80 }));
    expect(await refusal(guard.authenticate(`Bearer ${newSecret()}`, { mayBuffer: 80 }))).toBe(
      "unavailable AUTH_BUSY",
    );
    // A request with no body to buffer is not held back.
    const bodiless = refusal(guard.authenticate(`Bearer ${newSecret()}`, { mayBuffer: 0 }));
    // One that joins the slow lookup of the same token waits for it at no cost.
    const joiner = refusal(guard.authenticate(`Bearer ${secret}`, { mayBuffer: 80 }));
    release();
    expect(await first).toBe("ok");
    expect(await joiner).toBe("ok");
    expect(await bodiless).toBe("unauthenticated UNAUTHENTICATED");
  });

  it("reads a token known valid again on the urgent lane (knownTokens), an unknown one never", async () => {
    const urgent: string[] = [];
    const { guard, lookups, add } = guardWith({
      cacheMs: 0,
      knownTokens: {
        async findByDigest(digest) {
          urgent.push(digest);
          return undefined;
        },
      },
    });
    const secret = add("worker");
    expect(await refusal(guard.authenticate(`Bearer ${secret}`))).toBe("ok");
    expect([lookups.length, urgent.length]).toEqual([1, 0]);
    // Known valid, its entry stale: read again on the urgent lane (here: revoked since).
    expect(await refusal(guard.authenticate(`Bearer ${secret}`))).toBe(
      "unauthenticated UNAUTHENTICATED",
    );
    expect([lookups.length, urgent.length]).toEqual([1, 1]);
    await refusal(guard.authenticate(`Bearer ${newSecret()}`));
    expect([lookups.length, urgent.length]).toEqual([2, 1]);
  });
});

describe("failed authentications per source", () => {
  it("refuses with 429 past the burst, without a lookup, but not a known valid token, and counts sources apart", async () => {
    const { guard, lookups, add } = guardWith({ authFailureRate: 1, authFailureBurst: 3 });
    const secret = add("legit");
    const from = { source: "10.0.0.1" };
    expect(await refusal(guard.authenticate(`Bearer ${secret}`, from))).toBe("ok");
    for (let i = 0; i < 3; i++) {
      expect(await refusal(guard.authenticate(`Bearer ${newSecret()}`, from))).toBe(
        "unauthenticated UNAUTHENTICATED",
      );
    }
    const looked = lookups.length;
    expect(await refusal(guard.authenticate(`Bearer ${newSecret()}`, from))).toBe(
      "resource_exhausted AUTH_THROTTLED",
    );
    expect(await refusal(guard.authenticate(undefined, from))).toBe(
      "resource_exhausted AUTH_THROTTLED",
    );
    expect(lookups.length).toBe(looked);
    expect(await refusal(guard.authenticate(`Bearer ${secret}`, from))).toBe("ok");
    expect(await refusal(guard.authenticate(undefined, { source: "10.0.0.2" }))).toBe(
      "unauthenticated UNAUTHENTICATED",
    );
  });

  it("does not charge a source for lookups the database failed", async () => {
    let down = true;
    const { guard } = guardWith({ authFailureRate: 1, authFailureBurst: 2 }, async () => {
      if (down) throw new Error("connection refused");
    });
    const from = { source: "10.0.0.9" };
    for (let i = 0; i < 5; i++) {
      expect(await refusal(guard.authenticate(`Bearer ${newSecret()}`, from))).toBe(
        "Error: connection refused",
      );
    }
    down = false;
    expect(await refusal(guard.authenticate(`Bearer ${newSecret()}`, from))).toBe(
      "unauthenticated UNAUTHENTICATED",
    );
  });

  it("logs the first failure of a source at once and the rest as one line per window", () => {
    const lines: [object, string][] = [];
    let t = 0;
    const failures = createAuthFailures({
      rate: 0,
      burst: 1,
      log: { info: (o, m) => lines.push([o, m]) },
      now: () => t,
    });
    for (let i = 0; i < 500; i++) failures.record("10.0.0.9", i % 2 ? "missing" : "invalid");
    t = 11_000;
    failures.flush();
    expect(lines).toEqual([
      [{ peer: "10.0.0.9", why: "invalid" }, "authentication failed"],
      [
        {
          peer: "10.0.0.9",
          failures: 499,
          throttled: 0,
          why: ["invalid", "missing"],
          seconds: 11,
        },
        "more failed authentications",
      ],
    ]);
  });
});

describe("the tarpit", () => {
  it("holds at most perSource of one source and total of all, and lets go of a response that closes", async () => {
    const tarpit = createTarpit({
      delayMs: 50,
      perSource: 2,
      total: 3,
      maxBytesEach: 1 << 20,
      maxBytes: 1 << 30,
    });
    const answered: string[] = [];
    const res = () => new EventEmitter();
    const gone = res();
    expect(tarpit.hold("a", res(), () => answered.push("a1"))).toBe(true);
    expect(tarpit.hold("a", gone, () => answered.push("a2"))).toBe(true);
    expect(tarpit.hold("a", res(), () => answered.push("a3"))).toBe(false);
    expect(tarpit.hold("b", res(), () => answered.push("b1"))).toBe(true);
    expect(tarpit.hold("c", res(), () => answered.push("c1"))).toBe(false);
    gone.emit("close");
    expect(tarpit.hold("c", res(), () => answered.push("c2"))).toBe(true);
    await new Promise((r) => setTimeout(r, 120));
    expect(answered.sort()).toEqual(["a1", "b1", "c2"]);
  });

  it("answers at once a request whose unread body could pile up past its bounds", () => {
    const tarpit = createTarpit({
      delayMs: 50,
      perSource: 100,
      total: 100,
      maxBytesEach: 64 * 1024,
      maxBytes: 100 * 1024,
    });
    const res = () => new EventEmitter();
    const noop = () => {};
    // A stream of 4 MiB window, with DATA behind its headers: never held.
    expect(tarpit.hold("a", res(), noop, 4 << 20)).toBe(false);
    expect(tarpit.hold("a", res(), noop, 64 * 1024)).toBe(true);
    // Together they may hold 100 KiB: the next 64 KiB does not fit, a headers-only one does.
    expect(tarpit.hold("b", res(), noop, 64 * 1024)).toBe(false);
    expect(tarpit.hold("b", res(), noop, 0)).toBe(true);
  });
});
