import { describe, expect, it } from "vitest";
import { stringList, text, unstorableText } from "../../src/core/validate.js";

// Connect JSON can carry a lone UTF-16 surrogate ("\ud800"), which has no
// UTF-8 form: PostgreSQL's jsonb refuses it (a claim's capabilities travel
// as jsonb, several claims in one statement). It is refused at the door,
// with the field's name, as invalid_argument.
describe("text fields", () => {
  it("refuses a lone surrogate, high or low, and names the field", () => {
    expect(() => text("name", "a\ud800")).toThrow(/name is not valid Unicode text/);
    expect(() => text("name", "\udc00b")).toThrow(/not valid Unicode text/);
    expect(() => stringList("capabilities", ["ok", "x\ud800"])).toThrow(
      /capabilities entry is not valid Unicode text/,
    );
  });

  it("takes any well-formed text, pairs of surrogates included", () => {
    expect(text("name", "gpu-😀")).toBe("gpu-😀");
    expect(stringList("capabilities", ["a", "a", "ü"])).toEqual(["a", "ü"]);
  });
});

// A request holding U+0000 or a lone surrogate is refused before any statement, naming where.
describe("unstorableText", () => {
  it("names the string, element or key that holds U+0000", () => {
    const tasks = [{ workload: "a" }, { workload: "b", parameters: { k: ["x", "y\u0000"] } }];
    expect(unstorableText({ tasks })).toEqual({ path: "tasks[1].parameters.k[1]", why: "nul" });
    // A key is quoted as JSON quotes it: the path itself holds no U+0000.
    expect(unstorableText({ labels: { "a\u0000": "v" } })).toEqual({
      path: 'labels["a\\u0000"]',
      why: "nul",
    });
    expect(unstorableText("\u0000")).toEqual({ path: "(message)", why: "nul" });
  });

  it("names the string or key that holds a lone surrogate, high or low", () => {
    expect(unstorableText({ tasks: [{ parameters: { v: "a\ud800" } }] })).toEqual({
      path: "tasks[0].parameters.v",
      why: "surrogate",
    });
    expect(unstorableText({ metrics: { "\udc00x": 1 } })).toEqual({
      path: 'metrics["\\udc00x"]',
      why: "surrogate",
    });
  });

  it("quotes a key that is not a plain name, and cuts a long one to 64 characters", () => {
    expect(unstorableText({ parameters: { "a.b": { "c d": ["\u0000"] } } })).toEqual({
      path: 'parameters["a.b"]["c d"][0]',
      why: "nul",
    });
    const long = `${"k".repeat(100)}\u0000`;
    expect(unstorableText({ [long]: 1 })).toEqual({
      path: `[${JSON.stringify("k".repeat(64))}…]`,
      why: "nul",
    });
  });

  it("passes text without them, pairs of surrogates, and bytes, which may hold zeros", () => {
    expect(
      unstorableText({ tasks: [{ workload: "a😀", n: 1, ok: true, big: 2n, none: null }] }),
    ).toBe(undefined);
    expect(unstorableText({ data: new Uint8Array([0, 0, 1]) })).toBe(undefined);
  });
});
