import { describe, expect, it } from "vitest";
import { answeredWithError } from "../../src/db/faults.js";
import { createCompleteCalls } from "../../src/leases/complete-calls.js";
import type { Completion } from "../../src/leases/completion.js";
import type { Outcome } from "../../src/leases/store.js";

// The group commit of CompleteTask and CompleteTasks calls (app.ts): calls
// share statements, each gets its own outcomes, and one call's refusal by
// the database never fails the others.

const completion = (taskId: string): Completion => ({
  taskId,
  workerId: "w",
  attempt: 1,
  token: "t",
  result: null,
  summary: "",
  metrics: {},
});

const ok = (c: Completion): Outcome => ({ ok: { id: c.taskId } as never });

/** A statement that takes a moment, records what it was given, and may fail. */
function fakeStatement(fail: (items: Completion[]) => Error | undefined = () => undefined) {
  const statements: string[][] = [];
  const complete = async (items: Completion[]) => {
    statements.push(items.map((c) => c.taskId));
    await new Promise((r) => setTimeout(r, 5));
    const error = fail(items);
    if (error) throw error;
    return items.map(ok);
  };
  return { statements, complete };
}

const ids = (outcomes: Outcome[]) => outcomes.map((o) => ("ok" in o ? o.ok.id : "error"));

describe("completions grouped across calls", () => {
  it("answers each call with its own outcomes, in order, the calls made meanwhile in one statement", async () => {
    const { statements, complete } = fakeStatement();
    const calls = createCompleteCalls(complete);
    const answers = await Promise.all([
      calls([completion("a")]),
      calls([completion("b"), completion("c")]),
      calls([completion("d")]),
    ]);
    expect(answers.map(ids)).toEqual([["a"], ["b", "c"], ["d"]]);
    expect(statements).toEqual([["a"], ["b", "c", "d"]]);
  });

  it("runs each call alone when the database refuses the shared statement: only the bad call fails", async () => {
    const refused = Object.assign(new Error("invalid input syntax for type json"), {
      code: "22P02",
    });
    const { statements, complete } = fakeStatement((items) =>
      items.some((c) => c.taskId === "bad") ? refused : undefined,
    );
    const calls = createCompleteCalls(complete);
    const [first, bad, good] = await Promise.allSettled([
      calls([completion("a")]),
      calls([completion("bad")]),
      calls([completion("b"), completion("c")]),
    ]);
    expect(first).toMatchObject({ status: "fulfilled" });
    expect(bad).toMatchObject({ status: "rejected", reason: refused });
    expect(good.status === "fulfilled" && ids(good.value)).toEqual(["b", "c"]);
    expect(statements).toEqual([["a"], ["bad", "b", "c"], ["bad"], ["b", "c"]]);
  });

  it.each([
    ["a lost connection", "CONNECTION_CLOSED"],
    ["a broken pipe (five letters, no SQLSTATE)", "EPIPE"],
    ["a deadlock", "40P01"],
    ["a statement timeout", "57014"],
  ])(
    "sends a shared statement that met %s once more, whole, not once per call",
    async (_, code) => {
      const lost = Object.assign(new Error("transient"), { code });
      let failures = 1;
      const { statements, complete } = fakeStatement((items) =>
        items.length > 1 && failures-- > 0 ? lost : undefined,
      );
      const calls = createCompleteCalls(complete);
      const answers = await Promise.all([
        calls([completion("a")]),
        calls([completion("b")]),
        calls([completion("c")]),
      ]);
      expect(answers.map(ids)).toEqual([["a"], ["b"], ["c"]]);
      expect(statements).toEqual([["a"], ["b", "c"], ["b", "c"]]);
    },
  );

  it("keeps a call of 1,000 completions whole, in a statement of its own", async () => {
    const { statements, complete } = fakeStatement();
    const calls = createCompleteCalls(complete);
    const big = Array.from({ length: 1000 }, (_, i) => completion(`t${i}`));
    const answers = await Promise.all([
      calls([completion("a")]),
      calls([completion("b")]),
      calls(big),
      calls([completion("c")]),
    ]);
    expect(answers[2]).toHaveLength(1000);
    expect(statements.map((s) => s.length)).toEqual([1, 1, 1000, 1]);
  });

  it("tells an error the database answered (a SQLSTATE) from a socket's, which may have committed", () => {
    const coded = (code: string) => Object.assign(new Error(code), { code });
    expect(answeredWithError(coded("22P02"))).toBe(true);
    expect(answeredWithError(coded("XX000"))).toBe(true);
    // Wrapped, as Drizzle wraps the driver's error.
    expect(answeredWithError(new Error("query failed", { cause: coded("40P01") }))).toBe(true);
    for (const code of ["EPIPE", "ECONNRESET", "CONNECTION_CLOSED"]) {
      expect(answeredWithError(coded(code))).toBe(false);
    }
  });
});
