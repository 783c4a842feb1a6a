import { describe, expect, it } from "vitest";
import { type PrepareQuery, wrapPrepareQuery } from "../../src/db/prepare-hook.js";

/** A session class whose prepareQuery answers what it was given, as a list of calls. */
function sessionClass() {
  return class {
    prepareQuery(...args: Parameters<PrepareQuery>): unknown {
      return ["prepared", args[0].sql];
    }
  };
}

/** A wrapper that adds `tag` around what the original prepared. */
const tagging =
  (tag: string) =>
  (original: PrepareQuery): PrepareQuery =>
    function (this: unknown, ...args) {
      return [tag, original.apply(this, args)];
    };

const prepare = (session: object) =>
  (session as { prepareQuery: PrepareQuery }).prepareQuery(
    { sql: "select 1" },
    [],
    "",
    false,
    undefined,
  );

describe("wrapPrepareQuery", () => {
  it("wraps a class once per mark, whatever the number of calls", () => {
    const Session = sessionClass();
    const mark = Symbol("once");
    wrapPrepareQuery(Session, mark, tagging("a"));
    wrapPrepareQuery(Session, mark, tagging("a"));
    expect(prepare(new Session())).toEqual(["a", ["prepared", "select 1"]]);
  });

  it("stacks wrappers of different marks, the last outermost", () => {
    const Session = sessionClass();
    wrapPrepareQuery(Session, Symbol("inner"), tagging("inner"));
    wrapPrepareQuery(Session, Symbol("outer"), tagging("outer"));
    expect(prepare(new Session())).toEqual(["outer", ["inner", ["prepared", "select 1"]]]);
  });

  it("wraps a subclass of a wrapped class on its own, and leaves the base as it was", () => {
    const Base = sessionClass();
    const mark = Symbol("per-class");
    wrapPrepareQuery(Base, mark, tagging("base"));
    const Sub = class extends Base {};
    wrapPrepareQuery(Sub, mark, tagging("sub"));
    expect(prepare(new Sub())).toEqual(["sub", ["base", ["prepared", "select 1"]]]);
    expect(prepare(new Base())).toEqual(["base", ["prepared", "select 1"]]);
  });
});
