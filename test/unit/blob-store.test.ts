import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { createFileBlobStore, leftovers } from "../../src/artifacts/blob-store.js";

async function* chunks(...parts: string[]) {
  for (const p of parts) yield Buffer.from(p);
}

describe("file blob store", () => {
  it("clears what a crash left in tmp/ when it starts", async () => {
    const root = mkdtempSync(join(tmpdir(), "meshwork-blob-"));
    createFileBlobStore(root);
    writeFileSync(join(root, "tmp", "half-written"), "partial");
    createFileBlobStore(root);
    expect(await leftovers(root)).toEqual([]);
  });

  it("writes under sha256/ab/cd/<hex> only on commit, and keeps equal bytes once", async () => {
    const root = mkdtempSync(join(tmpdir(), "meshwork-blob-"));
    const store = createFileBlobStore(root);
    const staged = await store.stage(chunks("hello ", "world"), 100);
    const hex = createHash("sha256").update("hello world").digest("hex");
    expect(staged).toMatchObject({ sha256: hex, size: 11 });
    const path = join(root, "sha256", hex.slice(0, 2), hex.slice(2, 4), hex);
    expect(existsSync(path)).toBe(false);
    await staged.commit();
    expect(readFileSync(path, "utf8")).toBe("hello world");
    const again = await store.stage(chunks("hello world"), 100);
    await again.commit();
    expect(await leftovers(root)).toEqual([]);
    expect(await store.has(hex)).toBe(true);
  });

  it("refuses more than maxBytes as soon as they arrive, keeping nothing", async () => {
    const root = mkdtempSync(join(tmpdir(), "meshwork-blob-"));
    const store = createFileBlobStore(root);
    await expect(store.stage(chunks("12345", "6"), 5)).rejects.toMatchObject({
      kind: "resource_exhausted",
    });
    expect(await leftovers(root)).toEqual([]);
  });

  it("removes the temporary file when the source fails half-way", async () => {
    const root = mkdtempSync(join(tmpdir(), "meshwork-blob-"));
    const store = createFileBlobStore(root);
    async function* broken() {
      yield Buffer.from("part");
      throw new Error("client went away");
    }
    await expect(store.stage(broken(), 100)).rejects.toThrow("client went away");
    expect(await leftovers(root)).toEqual([]);
  });
});
