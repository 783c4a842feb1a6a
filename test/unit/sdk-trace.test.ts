import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { traceIdOf } from "../../src/sdk/trace.js";
import { traceIdOf as coordinatorTraceIdOf } from "../../src/tracing/context.js";

// The SDK imports nothing of the coordinator, so it has its own check of a
// traceparent (sdk/trace.ts); this holds it to the coordinator's
// (tracing/context.ts): the same trace id, or none, for any header.

const hex = (n: number) =>
  fc.string({ unit: fc.constantFrom(..."0123456789abcdefA"), minLength: n, maxLength: n });

const headers = fc.oneof(
  fc.string(),
  fc
    .tuple(
      fc.oneof(fc.constantFrom("00", "01", "ff", "0g"), hex(2)),
      fc.oneof(hex(32), fc.constant("0".repeat(32))),
      fc.oneof(hex(16), fc.constant("0".repeat(16))),
      hex(2),
      fc.constantFrom("", "-x", "-", " ", "-extra-fields"),
    )
    .map(([v, t, p, f, rest]) => `${v}-${t}-${p}-${f}${rest}`),
);

describe("the SDK's traceparent check", () => {
  it("gives the trace id the coordinator's gives, for any header", () => {
    fc.assert(
      fc.property(headers, (h) => {
        expect(traceIdOf(h)).toBe(coordinatorTraceIdOf(h));
      }),
      { numRuns: 2000 },
    );
    const valid = `00-${"ab".repeat(16)}-${"cd".repeat(8)}-01`;
    expect(traceIdOf(valid)).toBe("ab".repeat(16));
    expect(traceIdOf(` ${valid} `)).toBe("ab".repeat(16));
    expect(traceIdOf(`${valid}-more`)).toBe("");
    expect(traceIdOf(`01-${"ab".repeat(16)}-${"cd".repeat(8)}-01-more`)).toBe("ab".repeat(16));
    expect(traceIdOf("")).toBe("");
  });
});
