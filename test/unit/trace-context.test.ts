import { describe, expect, it } from "vitest";
import { commandEnv } from "../../src/cli/work.js";
import { traceHeaders } from "../../src/sdk/worker.js";
import {
  parseTraceparent,
  parseTracestate,
  traceFromHeaders,
  traceIdOf,
  traceparentOf,
} from "../../src/tracing/context.js";

// W3C trace context parsing (src/tracing/context.ts) and where a task's trace
// goes on the worker side: the SDK's headers and `meshwork work`'s environment.

const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
const span = "00f067aa0ba902b7";
const valid = `00-${traceId}-${span}-01`;

describe("traceparent", () => {
  it("reads a valid one, and a later version's first four fields", () => {
    expect(parseTraceparent(valid)).toEqual({ traceId, parentId: span, flags: "01" });
    expect(parseTraceparent(`cc-${traceId}-${span}-00-what-comes-next`)).toEqual({
      traceId,
      parentId: span,
      flags: "00",
    });
  });

  it.each([
    ["empty", ""],
    ["all-zero trace id", `00-${"0".repeat(32)}-${span}-01`],
    ["all-zero parent id", `00-${traceId}-${"0".repeat(16)}-01`],
    ["version ff", `ff-${traceId}-${span}-01`],
    ["uppercase", `00-${traceId.toUpperCase()}-${span}-01`],
    ["short trace id", `00-${traceId.slice(1)}-${span}-01`],
    ["version 00 with more fields", `${valid}-x`],
    ["no flags", `00-${traceId}-${span}`],
    ["too long", `${valid}${"-x".repeat(300)}`],
  ])("ignores one with %s", (_, value) => {
    expect(parseTraceparent(value)).toBeUndefined();
    const trace = traceFromHeaders(value, "a=b");
    expect(trace.traceId).toMatch(/^[0-9a-f]{32}$/);
    expect(trace.traceId).not.toBe(traceId);
    expect(trace).toMatchObject({ parentSpanId: "", flags: "00", state: "" });
  });

  it("hands on the caller's trace with the request's span as parent", () => {
    const trace = traceFromHeaders(valid, "rojo=00f067aa0ba902b7");
    expect(trace).toMatchObject({ traceId, parentSpanId: span, flags: "01" });
    expect(trace.spanId).toMatch(/^[0-9a-f]{16}$/);
    expect(trace.spanId).not.toBe(span);
    expect(traceparentOf(trace)).toBe(`00-${traceId}-${trace.spanId}-01`);
    expect(trace.state).toBe("rojo=00f067aa0ba902b7");
    expect(traceIdOf(traceparentOf(trace))).toBe(traceId);
    expect(traceIdOf("nonsense")).toBe("");
  });
});

describe("tracestate", () => {
  it("keeps a valid list, drops anything else", () => {
    expect(parseTracestate("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")).toBe(
      "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
    );
    expect(parseTracestate("tenant@vendor=x")).toBe("tenant@vendor=x");
    expect(parseTracestate("Upper=x")).toBe("");
    expect(parseTracestate("novalue")).toBe("");
    expect(parseTracestate(`a=${"x".repeat(600)}`)).toBe("");
    expect(parseTracestate("a=b\u0001")).toBe("");
    expect(parseTracestate(Array.from({ length: 33 }, (_, i) => `k${i}=v`).join(","))).toBe("");
  });
});

describe("a task's trace on the worker side", () => {
  it("is sent by the SDK as headers, when the claim has one", () => {
    expect(traceHeaders({ traceparent: valid, tracestate: "a=b" })).toEqual({
      traceparent: valid,
      tracestate: "a=b",
    });
    expect(traceHeaders({ traceparent: "", tracestate: "a=b" })).toEqual({});
  });

  it("is TRACEPARENT and TRACESTATE in a `meshwork work` command's environment, never the worker's own", () => {
    const saved = { ...process.env };
    process.env.TRACEPARENT = `00-${"1".repeat(32)}-${span}-01`;
    process.env.TRACESTATE = "worker=own";
    try {
      const env = commandEnv({ MESHWORK_TASK_ID: "t" }, { traceparent: valid, tracestate: "a=b" });
      expect(env).toMatchObject({ TRACEPARENT: valid, TRACESTATE: "a=b", MESHWORK_TASK_ID: "t" });
      const none = commandEnv({}, { traceparent: "", tracestate: "" });
      expect(none.TRACEPARENT).toBeUndefined();
      expect(none.TRACESTATE).toBeUndefined();
    } finally {
      process.env = saved;
    }
  });
});
