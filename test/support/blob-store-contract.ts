import { createHash } from "node:crypto";
import type { Readable } from "node:stream";
import { expect, it } from "vitest";
import type { BlobStore } from "../../src/artifacts/blob-store.js";
import { verifiedRead } from "../../src/artifacts/verify.js";

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

/**
 * Reads verified against their hash (src/artifacts/verify.ts), on a store
 * whose stored copy `damage` changes behind its back (one byte flipped):
 * whole and ranged reads fail with `data_loss` without giving the last
 * chunk, the blob is marked, and a commit of the same bytes with `replace`
 * stores a good copy that reads back whole.
 */
export function verifiedReadContract(
  setup: () => Promise<{ store: BlobStore; damage(sha256: string): Promise<void> }>,
  size = 300_000,
): void {
  it("refuses damaged bytes on every read, marks them, and takes a good copy with replace", async () => {
    const { store, damage } = await setup();
    const data = Buffer.alloc(300_000, 0).map((_, i) => (i * 7) & 0xff);
    const staged = await store.stage(
      chunks(data.subarray(0, 100_000), data.subarray(100_000)),
      1e6,
    );
    await staged.commit();
    const marked = new Set<string>();
    const deps = {
      blobs: store,
      artifacts: {
        isCorrupt: async (s: string) => marked.has(s),
        markCorrupt: async (s: string) => {
          marked.add(s);
        },
      },
    };
    const bytes = { id: "a1", sha256: staged.sha256, sizeBytes: data.length };
    expect(await readAll(verifiedRead(deps, bytes))).toEqual(Buffer.from(data));
    await damage(staged.sha256);
    for (const range of [undefined, { start: 0, end: 10 }, { start: size - 10, end: size - 1 }]) {
      const got: Buffer[] = [];
      const failure = await (async () => {
        for await (const c of verifiedRead(deps, bytes, range)) got.push(c as Buffer);
      })().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(failure).toMatchObject({ kind: "data_loss", reason: "ARTIFACT_CORRUPT" });
      // What was given is never all of it.
      const expected = range ? range.end - range.start + 1 : data.length;
      expect(Buffer.concat(got).length).toBeLessThan(expected);
    }
    expect(marked.has(staged.sha256)).toBe(true);
    const again = await store.stage(chunks(data), 1e6);
    await again.commit({ replace: true });
    expect(await readAll(verifiedRead(deps, bytes))).toEqual(Buffer.from(data));
  });
}
