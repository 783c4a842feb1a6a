import type { ServiceImpl } from "@connectrpc/connect";
import type {
  ArtifactService,
  UploadArtifactHeader,
  UploadArtifactRequest,
} from "../../gen/meshwork/v1/artifact_pb.js";
import type { Config } from "../config.js";
import { invalid } from "../core/errors.js";
import { decodeCursor, pageSize } from "../core/paging.js";
import { uuidField } from "../core/validate.js";
import type { Logger } from "../log.js";
import type { Metrics } from "../metrics/metrics.js";
import type { BlobStore } from "./blob-store.js";
import { kindName, toArtifact } from "./convert.js";
import { assertReachable } from "./reachable.js";
import type { ArtifactStore } from "./store.js";
import { storeUpload, type UploadDeps } from "./uploads.js";
import { assertNotCorrupt, found, hashStored, type VerifyDeps, verifiedRead } from "./verify.js";

/** Bytes per DownloadArtifact message. */
const chunkBytes = 256 * 1024;

/** What ArtifactService uses. */
export interface ArtifactServiceDeps extends UploadDeps, VerifyDeps {
  config: Pick<Config, "maxArtifactBytes" | "publicUrl">;
  artifacts: Pick<
    ArtifactStore,
    | "checkLease"
    | "insert"
    | "get"
    | "list"
    | "isCorrupt"
    | "markCorrupt"
    | "clearCorrupt"
    | "blobs"
  >;
  blobs: Pick<BlobStore, "stage" | "read" | "has">;
  /** Listing a task's artifacts first checks that the task exists (`not_found`). */
  tasks: { get(taskId: string): Promise<unknown> };
  metrics: Pick<Metrics, "artifactBytesIn" | "artifactBytesOut" | "corruptBlobs">;
  log: Pick<Logger, "error" | "warn">;
}

/** ArtifactService: streamed uploads and downloads of coordinator-owned bytes. */
export function createArtifactService(
  app: ArtifactServiceDeps,
): ServiceImpl<typeof ArtifactService> {
  const publicUrl = app.config.publicUrl;
  return {
    async uploadArtifact(requests) {
      const it = requests[Symbol.asyncIterator]();
      const first = await it.next();
      if (first.done || first.value.payload.case !== "header") {
        throw invalid("the first UploadArtifact message must be a header");
      }
      const h: UploadArtifactHeader = first.value.payload.value;
      async function* chunks(): AsyncIterable<Uint8Array> {
        for (;;) {
          const next: IteratorResult<UploadArtifactRequest> = await it.next();
          if (next.done) return;
          if (next.value.payload.case !== "chunk") {
            throw invalid("only the first UploadArtifact message may be a header");
          }
          yield next.value.payload.value;
        }
      }
      const row = await storeUpload(
        app,
        {
          taskId: h.taskId,
          workerId: h.workerId,
          attempt: h.attempt,
          leaseToken: h.leaseToken,
          filename: h.filename,
          contentType: h.contentType,
          kind: kindName(h.kind),
          sha256: h.sha256,
          sizeBytes: h.sizeBytes === undefined ? undefined : Number(h.sizeBytes),
        },
        chunks(),
      );
      return { artifact: toArtifact(row, publicUrl) };
    },

    async *downloadArtifact(req, ctx) {
      const row = await app.artifacts.get(uuidField("artifact_id", req.artifactId));
      const offset = Number(req.offset);
      const limit = Number(req.limit);
      if (offset < 0 || offset > row.sizeBytes) {
        throw invalid(`offset must be from 0 to ${row.sizeBytes}`);
      }
      if (limit < 0) throw invalid("limit must not be negative");
      const end = limit === 0 ? row.sizeBytes : Math.min(row.sizeBytes, offset + limit);
      let first = true;
      if (end > offset) {
        await assertReachable(app.blobs, row);
        await assertNotCorrupt(app, row);
        const stream = verifiedRead(app, row, { start: offset, end: end - 1 });
        try {
          let pending: Buffer[] = [];
          let size = 0;
          for await (const data of stream as AsyncIterable<Buffer>) {
            if (ctx.signal.aborted) return;
            pending.push(data);
            size += data.byteLength;
            if (size >= chunkBytes) {
              app.metrics.artifactBytesOut.inc(size);
              yield {
                artifact: first ? toArtifact(row, publicUrl) : undefined,
                chunk: Buffer.concat(pending),
              };
              first = false;
              pending = [];
              size = 0;
            }
          }
          if (size > 0) {
            app.metrics.artifactBytesOut.inc(size);
            yield {
              artifact: first ? toArtifact(row, publicUrl) : undefined,
              chunk: Buffer.concat(pending),
            };
            first = false;
          }
        } finally {
          stream.destroy();
        }
      }
      if (first) yield { artifact: toArtifact(row, publicUrl), chunk: new Uint8Array() };
    },

    async getArtifact(req) {
      const row = await app.artifacts.get(uuidField("artifact_id", req.artifactId));
      return { artifact: toArtifact(row, publicUrl) };
    },

    async *verifyArtifacts(_req, ctx) {
      const summary = { checked: 0n, corrupt: 0n, missing: 0n, bytes: 0n };
      let after = "";
      for (;;) {
        const page = await app.artifacts.blobs(after, 100);
        for (const blob of page) {
          if (ctx.signal.aborted) return;
          after = blob.sha256;
          const read = await hashStored(app.blobs, blob.sha256);
          if (read === "missing") {
            summary.missing++;
            continue;
          }
          summary.checked++;
          summary.bytes += BigInt(read.bytes);
          if (read.actual === blob.sha256 && read.bytes === blob.sizeBytes) {
            // Good again (repaired by hand, or a mark from a read that misfired).
            await app.artifacts.clearCorrupt(blob.sha256);
            continue;
          }
          summary.corrupt++;
          await found(app, { id: blob.artifactIds[0] ?? "", ...blob }, read.actual);
          yield {
            result: {
              case: "corrupt" as const,
              value: {
                sha256: blob.sha256,
                actualSha256: read.actual,
                sizeBytes: BigInt(blob.sizeBytes),
                artifactIds: blob.artifactIds,
              },
            },
          };
        }
        if (page.length < 100) break;
      }
      yield { result: { case: "summary" as const, value: summary } };
    },

    async listArtifacts(req) {
      const taskId = uuidField("task_id", req.taskId);
      await app.tasks.get(taskId);
      const page = await app.artifacts.list(
        taskId,
        pageSize(req.pageSize),
        decodeCursor(req.pageToken),
      );
      return {
        artifacts: page.rows.map((r) => toArtifact(r, publicUrl)),
        nextPageToken: page.next,
      };
    },
  };
}
