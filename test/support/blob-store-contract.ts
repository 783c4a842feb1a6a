import { createHash } from "node:crypto";
import type { Readable } from "node:stream";
import { expect, it } from "vitest";
import type { BlobStore } from "../../src/artifacts/blob-store.js";

/** A blob store under test and what it left behind outside its committed blobs. */
export interface BlobStoreUnderTest {
  store: BlobStore;
  /** Temporary copies (and, for S3, open multipart uploads) still there: none after any stage. */
  leftovers(): Promise<string[]>;
}

export async function* chunks(...parts: (string | Uint8Array)[]) {
  for (const p of parts) yield typeof p === "string" ? Buffer.from(p) : p;
}

export const sha = (b: string | Uint8Array) => createHash("sha256").update(b).digest("hex");

export async function readAll(stream: Readable): Promise<Buffer> {
  const out: Buffer[] = [];
  for await (const c of stream) out.push(c as Buffer);
  return Buffer.concat(out);
}

/**
 * What every blob store does (file, S3, …), run against the one `setup`
 * makes: the same tests, the same expectations.
 */
export function blobStoreContract(setup: () => Promise<BlobStoreUnderTest>): void {
  it("hashes while staging, shows the blob only once committed, and reads it back", async () => {
    const { store, leftovers } = await setup();
    const staged = await store.stage(chunks("hello ", "world"), 100);
    expect(staged).toMatchObject({ sha256: sha("hello world"), size: 11 });
    expect(await store.has(staged.sha256)).toBe(false);
    await staged.commit();
    expect(await store.has(staged.sha256)).toBe(true);
    expect((await readAll(store.read(staged.sha256))).toString()).toBe("hello world");
    expect(await leftovers()).toEqual([]);
  });

  it("reads ranges, first and last bytes included", async () => {
    const { store } = await setup();
    const data = Buffer.from("0123456789abcdefghij");
    const staged = await store.stage(chunks(data), 100);
    await staged.commit();
    const read = async (start: number, end: number) =>
      (await readAll(store.read(staged.sha256, { start, end }))).toString();
    expect(await read(0, 0)).toBe("0");
    expect(await read(0, 9)).toBe("0123456789");
    expect(await read(5, 7)).toBe("567");
    expect(await read(19, 19)).toBe("j");
    expect(await read(10, 19)).toBe("abcdefghij");
  });

  it("stores an empty blob", async () => {
    const { store, leftovers } = await setup();
    const staged = await store.stage(chunks(), 100);
    expect(staged).toMatchObject({ sha256: sha(""), size: 0 });
    await staged.commit();
    expect(await store.has(sha(""))).toBe(true);
    expect(await leftovers()).toEqual([]);
  });

  it("keeps the same bytes once, however often they are committed", async () => {
    const { store, leftovers } = await setup();
    const first = await store.stage(chunks("same bytes"), 100);
    const second = await store.stage(chunks("same ", "bytes"), 100);
    await first.commit();
    await second.commit();
    const third = await store.stage(chunks("same bytes"), 100);
    await third.commit();
    expect((await readAll(store.read(sha("same bytes")))).toString()).toBe("same bytes");
    expect(await leftovers()).toEqual([]);
  });

  it("discards a staged blob without a trace", async () => {
    const { store, leftovers } = await setup();
    const staged = await store.stage(chunks("to be discarded"), 100);
    await staged.discard();
    expect(await store.has(staged.sha256)).toBe(false);
    expect(await leftovers()).toEqual([]);
  });

  it("refuses more than maxBytes as soon as they arrive, keeping nothing", async () => {
    const { store, leftovers } = await setup();
    await expect(store.stage(chunks("12345", "6"), 5)).rejects.toMatchObject({
      kind: "resource_exhausted",
      reason: "ARTIFACT_TOO_LARGE",
    });
    expect(await leftovers()).toEqual([]);
  });

  it("accepts exactly maxBytes", async () => {
    const { store } = await setup();
    const staged = await store.stage(chunks("12345"), 5);
    expect(staged.size).toBe(5);
    await staged.discard();
  });

  it("keeps nothing when the source fails half-way, and rethrows its error", async () => {
    const { store, leftovers } = await setup();
    async function* broken() {
      yield Buffer.from("part");
      throw new Error("client went away");
    }
    await expect(store.stage(broken(), 100)).rejects.toThrow("client went away");
    expect(await leftovers()).toEqual([]);
  });

  it("removes a committed blob; removing a missing one is no error", async () => {
    const { store } = await setup();
    const staged = await store.stage(chunks("to be removed"), 100);
    await staged.commit();
    expect(await store.has(staged.sha256)).toBe(true);
    await store.remove?.(staged.sha256);
    expect(await store.has(staged.sha256)).toBe(false);
    await store.remove?.(staged.sha256);
  });

  it("answers has() false for a blob it never had, and fails a read of it on the stream", async () => {
    const { store } = await setup();
    const missing = sha("never stored");
    expect(await store.has(missing)).toBe(false);
    const stream = store.read(missing); // returned, not thrown
    await expect(readAll(stream)).rejects.toThrow();
  });
}
