import { createHash } from "node:crypto";
import {
  type Artifact,
  ArtifactKind,
  type UploadArtifactRequest,
} from "../../gen/meshwork/v1/artifact_pb.js";
import { retrying } from "./rpc.js";
import { type Running, type Session, underLease } from "./session.js";
import { traceHeaders } from "./trace.js";
import type { UploadBody, UploadOptions } from "./types.js";

const chunkBytes = 64 * 1024;

/**
 * Uploads an artifact of the task under its lease (`ctx.upload`), in
 * chunks of 64 KiB. Bytes (or text) are sent with their SHA-256 and size,
 * and again after a transient failure; a stream is sent once, as it comes.
 */
export function upload(
  s: Session,
  entry: Running,
  name: string,
  body: UploadBody,
  uploadOptions: UploadOptions = {},
): Promise<Artifact> {
  const { claim } = entry;
  const whole = typeof body === "string" ? Buffer.from(body) : body;
  const header = {
    taskId: claim.taskId,
    workerId: s.workerId,
    attempt: claim.attempt,
    leaseToken: claim.leaseToken,
    filename: name,
    contentType: uploadOptions.contentType ?? "application/octet-stream",
    kind: uploadOptions.kind === "checkpoint" ? ArtifactKind.CHECKPOINT : ArtifactKind.OUTPUT,
    sha256: whole instanceof Uint8Array ? createHash("sha256").update(whole).digest("hex") : "",
    sizeBytes: whole instanceof Uint8Array ? BigInt(whole.byteLength) : undefined,
  };
  async function* messages(): AsyncGenerator<Omit<UploadArtifactRequest, "$typeName">> {
    yield {
      payload: {
        case: "header",
        value: { $typeName: "meshwork.v1.UploadArtifactHeader", ...header },
      },
    };
    if (whole instanceof Uint8Array) {
      for (let at = 0; at < whole.byteLength; at += chunkBytes) {
        yield { payload: { case: "chunk", value: whole.subarray(at, at + chunkBytes) } };
      }
      return;
    }
    for await (const chunk of whole) {
      const bytes = typeof chunk === "string" ? Buffer.from(chunk) : chunk;
      for (let at = 0; at < bytes.byteLength; at += chunkBytes) {
        yield { payload: { case: "chunk", value: bytes.subarray(at, at + chunkBytes) } };
      }
    }
  }
  const once = async () => {
    const res = await s.artifacts.uploadArtifact(messages(), {
      signal: entry.abort.signal,
      headers: traceHeaders(claim),
    });
    if (!res.artifact) throw new Error("the coordinator answered no artifact");
    return res.artifact;
  };
  // Bytes can be sent again after a transient failure; a stream cannot.
  return underLease(s, entry, () =>
    whole instanceof Uint8Array ? retrying(once, { signal: entry.abort.signal }) : once(),
  );
}
