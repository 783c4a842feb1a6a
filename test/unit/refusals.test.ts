import { readFileSync } from "node:fs";
import { Code } from "@connectrpc/connect";
import {
  codeFromString,
  codeToHttpStatus,
  codeToString,
} from "@connectrpc/connect/protocol-connect";
import { describe, expect, it } from "vitest";
import { ReasonSchema } from "../../gen/meshwork/v1/errors_pb.js";
import { codeOfKind, type Reason, refusalOf, refusals } from "../../src/core/refusals.js";
import { httpStatusOfCode } from "../../src/http/refusal-json.js";

const prefix = "REASON_";
const table = Object.keys(refusals).sort();
const proto = ReasonSchema.values
  .map((v) => v.name)
  .filter((n) => n !== "REASON_UNSPECIFIED")
  .map((n) => n.slice(prefix.length))
  .sort();

describe("the refusal table", () => {
  it("names exactly the reasons errors.proto lists, both ways", () => {
    expect(table.filter((r) => !proto.includes(r))).toEqual([]);
    expect(proto.filter((r) => !table.includes(r))).toEqual([]);
    for (const v of ReasonSchema.values) expect(v.name.startsWith(prefix)).toBe(true);
  });

  it("says each reason's code in errors.proto as in the table", () => {
    const text = readFileSync(new URL("../../proto/meshwork/v1/errors.proto", import.meta.url), {
      encoding: "utf8",
    });
    for (const [reason, r] of Object.entries(refusals)) {
      const comment = new RegExp(`// ${prefix}${reason}:(.*?)\\n\\s*${prefix}${reason} =`, "s");
      const [, doc = ""] = comment.exec(text) ?? [];
      expect(doc.replace(/\s*\/\/\s*/g, " "), reason).toContain(`(\`${r.kind}\`, HTTP ${r.http}`);
    }
  });

  it("sends Connect's HTTP status for each code, but 507 for STORAGE_FULL", () => {
    // codeToHttpStatus is connect-es's own table (marked internal): read
    // here only, so that a difference from it is a decision written in
    // refusals.ts, never an accident.
    const differs = Object.entries(refusals)
      .filter(([, r]) => r.http !== codeToHttpStatus(codeOfKind(r.kind)))
      .map(([reason, r]) => `${reason} ${r.http}`);
    expect(differs).toEqual(["STORAGE_FULL 507"]);
  });

  it("answers a code without a reason as Connect does", () => {
    for (let code = Code.Canceled; code <= Code.Unauthenticated; code++) {
      expect(httpStatusOfCode[code as Code] ?? 500, codeToString(code)).toBe(
        codeToHttpStatus(code),
      );
    }
  });

  it("spells each kind as the wire spells its code", () => {
    for (const r of Object.values(refusals)) expect(codeToString(codeOfKind(r.kind))).toBe(r.kind);
  });

  it("has a one-line doc for each reason", () => {
    for (const [reason, r] of Object.entries(refusals)) {
      expect(r.doc, reason).toMatch(/^[a-z`].{10,110}$/);
    }
  });

  it("finds a reason a client sent back, and nothing for another string", () => {
    expect(refusalOf("STALE_ATTEMPT" satisfies Reason)?.kind).toBe("aborted");
    expect(refusalOf("toString")).toBeUndefined();
    expect(refusalOf("NOT_A_REASON")).toBeUndefined();
  });
});

describe("the code converter (connect-es codeToString / codeFromString)", () => {
  // Both are exported from @connectrpc/connect/protocol-connect but marked
  // internal (no semver promise; the version is pinned in package.json):
  // they are what connect-es writes as an error's `code` on the wire, so
  // the names here are the wire's. This pins them for every code.
  it("names every code as the Connect protocol does, and reads each name back", () => {
    const names: Record<number, string> = {
      [Code.Canceled]: "canceled",
      [Code.Unknown]: "unknown",
      [Code.InvalidArgument]: "invalid_argument",
      [Code.DeadlineExceeded]: "deadline_exceeded",
      [Code.NotFound]: "not_found",
      [Code.AlreadyExists]: "already_exists",
      [Code.PermissionDenied]: "permission_denied",
      [Code.ResourceExhausted]: "resource_exhausted",
      [Code.FailedPrecondition]: "failed_precondition",
      [Code.Aborted]: "aborted",
      [Code.OutOfRange]: "out_of_range",
      [Code.Unimplemented]: "unimplemented",
      [Code.Internal]: "internal",
      [Code.Unavailable]: "unavailable",
      [Code.DataLoss]: "data_loss",
      [Code.Unauthenticated]: "unauthenticated",
    };
    for (const [code, name] of Object.entries(names)) {
      expect(codeToString(Number(code) as Code)).toBe(name);
      expect(codeFromString(name)).toBe(Number(code));
    }
    expect(codeFromString("no_such_code")).toBeUndefined();
  });
});
