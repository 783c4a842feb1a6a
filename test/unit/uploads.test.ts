import { describe, expect, it, vi } from "vitest";
import type { StagedBlob } from "../../src/artifacts/blob-store.js";
import { BlobStoreUnavailable } from "../../src/artifacts/blob-unavailable.js";
import { storeUpload, type UploadDeps, type UploadHeader } from "../../src/artifacts/uploads.js";

/** An upload whose bytes hash to "a…" while S3 (say) cannot delete the temporary copy. */
function flakyDiscard() {
  const staged: StagedBlob = {
    sha256: "a".repeat(64),
    size: 3,
    commit: vi.fn(async () => {}),
    discard: vi.fn(async () => {
      throw new BlobStoreUnavailable("S3 DeleteObject failed: InternalError (HTTP 500)");
    }),
  };
  const warn = vi.fn();
  const deps: UploadDeps = {
    config: { maxArtifactBytes: 100 },
    artifacts: {
      checkLease: vi.fn(async () => {}),
      insert: vi.fn(async () => {
        throw new Error("insert must not run");
      }),
    },
    blobs: { stage: async () => staged, has: async () => true },
    log: { warn } as unknown as UploadDeps["log"],
  };
  return { staged, deps, warn };
}

const header: UploadHeader = {
  taskId: "",
  workerId: "",
  attempt: 0,
  leaseToken: "",
  filename: "in.bin",
  contentType: "",
  kind: "INPUT",
  sha256: "",
  sizeBytes: undefined,
};

async function* bytes() {
  yield new Uint8Array([1, 2, 3]);
}

describe("storeUpload", () => {
  it("reports a checksum mismatch as such when removing the temporary copy fails too", async () => {
    const { staged, deps, warn } = flakyDiscard();
    const error = await storeUpload(deps, { ...header, sha256: "b".repeat(64) }, bytes()).catch(
      (e: unknown) => e,
    );
    expect(error).toMatchObject({ kind: "invalid_argument", reason: "CHECKSUM_MISMATCH" });
    expect(staged.discard).toHaveBeenCalledOnce();
    expect(staged.commit).not.toHaveBeenCalled();
    expect(warn).toHaveBeenCalledOnce();
  });

  it("reports a size mismatch as such when removing the temporary copy fails too", async () => {
    const { deps } = flakyDiscard();
    await expect(storeUpload(deps, { ...header, sizeBytes: 4 }, bytes())).rejects.toMatchObject({
      reason: "SIZE_MISMATCH",
    });
  });
});
