import { createHash } from "node:crypto";
import { Readable } from "node:stream";
import { describe, expect, it } from "vitest";
import type { BlobStore } from "../../src/artifacts/blob-store.js";
import { verifiedRead } from "../../src/artifacts/verify.js";

const read = async (r: Readable) => {
  const got: Buffer[] = [];
  for await (const c of r) got.push(c as Buffer);
  return Buffer.concat(got);
};

describe("a verified read of bytes replaced while it ran", () => {
  it("does not mark the good copy corrupt: the read fails as unavailable, and the next one is whole", async () => {
    const good = Buffer.from("frame 0001 of the final render");
    const sha256 = createHash("sha256").update(good).digest("hex");
    const bad = Buffer.from(good);
    bad[3] = 0x21;
    // The first read streams the old, damaged copy; an upload replaces it meanwhile.
    let reads = 0;
    const blobs = {
      read: () => Readable.from([reads++ === 0 ? bad : good]),
      has: async () => true,
    } as unknown as BlobStore;
    const marked: string[] = [];
    const deps = {
      blobs,
      artifacts: {
        isCorrupt: async () => false,
        markCorrupt: async (s: string) => void marked.push(s),
      },
    };
    const bytes = { id: "a1", sha256, sizeBytes: good.length };
    await expect(read(verifiedRead(deps, bytes))).rejects.toMatchObject({
      name: "BlobStoreUnavailable",
    });
    expect(marked).toEqual([]);
    expect(await read(verifiedRead(deps, bytes))).toEqual(good);
  });
});
