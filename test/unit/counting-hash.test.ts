import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { countingHash, tooLarge } from "../../src/artifacts/counting-hash.js";
import { DomainError } from "../../src/core/errors.js";

async function* chunksOf(...parts: string[]): AsyncGenerator<Uint8Array> {
  for (const p of parts) yield Buffer.from(p);
}

describe("countingHash", () => {
  it("passes the chunks on as they are, counting and hashing them", async () => {
    const bytes = countingHash(chunksOf("hello ", "", "world"), 11);
    const seen: string[] = [];
    for await (const chunk of bytes) seen.push(Buffer.from(chunk).toString());
    expect(seen).toEqual(["hello ", "", "world"]);
    expect(bytes.size).toBe(11);
    expect(bytes.sha256()).toBe(createHash("sha256").update("hello world").digest("hex"));
  });

  it("refuses the chunk that goes over the cap, before passing it on", async () => {
    const bytes = countingHash(chunksOf("abc", "def", "never read"), 5);
    const seen: string[] = [];
    const error = await (async () => {
      for await (const chunk of bytes) seen.push(Buffer.from(chunk).toString());
    })().catch((e: unknown) => e);
    expect(seen).toEqual(["abc"]);
    expect(error).toBeInstanceOf(DomainError);
    expect(error).toMatchObject({
      kind: "resource_exhausted",
      reason: "ARTIFACT_TOO_LARGE",
      message: "the artifact is larger than the limit of 5 bytes",
    });
    expect(tooLarge(5)).toMatchObject({ reason: "ARTIFACT_TOO_LARGE" });
  });

  it("has no cap unless given one", async () => {
    const bytes = countingHash(chunksOf("x".repeat(1000)));
    for await (const _ of bytes);
    expect(bytes.size).toBe(1000);
  });
});
