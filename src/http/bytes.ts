import type * as http from "node:http";
import { pipeline } from "node:stream/promises";
import { toArtifactRefJson } from "../artifacts/convert.js";
import { assertReachable } from "../artifacts/reachable.js";
import type { ArtifactStore } from "../artifacts/store.js";
import { storeUpload, type UploadDeps } from "../artifacts/uploads.js";
import { assertNotCorrupt, type VerifyDeps, verifiedRead } from "../artifacts/verify.js";
import type { Config } from "../config.js";
import { DomainError, invalid } from "../core/errors.js";
import { isUuid } from "../core/validate.js";
import type { ArtifactRow } from "../db/schema/index.js";
import type { Metrics } from "../metrics/metrics.js";
import type { TaskStore } from "../tasks/store.js";
import { sendJson } from "./json.js";
import { header, type PlainRoute, type Request, type Response } from "./routes.js";

/**
 * What the byte routes use (the app satisfies it): an upload's and a
 * download's dependencies, and the task a task's input or result belongs to.
 */
export type ByteRouteDeps = UploadDeps &
  VerifyDeps & {
    config: Pick<Config, "publicUrl">;
    artifacts: Pick<ArtifactStore, "get">;
    tasks: Pick<TaskStore, "get" | "dependencyOutputs">;
    metrics: Pick<Metrics, "artifactBytesIn" | "artifactBytesOut" | "corruptBlobs">;
  };

/** Parses a single `bytes=` range; undefined for none (or several: served whole). */
function parseRange(
  value: string,
  size: number,
): { start: number; end: number } | "unsatisfiable" | undefined {
  const m = /^bytes=(\d*)-(\d*)$/.exec(value.trim());
  if (!m) return undefined;
  const [, a, b] = m;
  if (a === "" && b === "") return undefined;
  let start: number;
  let end: number;
  if (a === "") {
    const suffix = Number(b);
    if (suffix === 0) return "unsatisfiable";
    start = Math.max(0, size - suffix);
    end = size - 1;
  } else {
    start = Number(a);
    end = b === "" ? size - 1 : Math.min(Number(b), size - 1);
  }
  if (start >= size || start > end) return "unsatisfiable";
  return { start, end };
}

/** Streams an artifact's bytes: Content-Length, ETag (the sha256), one Range → 206. */
async function sendArtifact(
  app: ByteRouteDeps,
  req: Request,
  res: Response,
  row: ArtifactRow,
): Promise<void> {
  await assertReachable(app.blobs, row);
  await assertNotCorrupt(app, row);
  const etag = `"${row.sha256}"`;
  const headers: Record<string, string | number> = {
    "content-type": row.contentType || "application/octet-stream",
    etag,
    "accept-ranges": "bytes",
    "x-content-sha256": row.sha256,
  };
  if (header(req, "if-none-match") === etag) {
    (res as http.ServerResponse).writeHead(304, headers);
    res.end();
    return;
  }
  const rangeHeader = header(req, "range");
  const range = rangeHeader ? parseRange(rangeHeader, row.sizeBytes) : undefined;
  if (range === "unsatisfiable") {
    (res as http.ServerResponse).writeHead(416, {
      ...headers,
      "content-range": `bytes */${row.sizeBytes}`,
    });
    res.end();
    return;
  }
  if (range) {
    (res as http.ServerResponse).writeHead(206, {
      ...headers,
      "content-length": range.end - range.start + 1,
      "content-range": `bytes ${range.start}-${range.end}/${row.sizeBytes}`,
    });
  } else {
    (res as http.ServerResponse).writeHead(200, { ...headers, "content-length": row.sizeBytes });
  }
  if (req.method === "HEAD" || row.sizeBytes === 0) {
    res.end();
    return;
  }
  const length = range ? range.end - range.start + 1 : row.sizeBytes;
  // Hashed as it goes: corrupt bytes end the response short of its length (verify.ts).
  await pipeline(verifiedRead(app, row, range), res as http.ServerResponse).then(
    () => app.metrics.artifactBytesOut.inc(length),
    (error: unknown) => {
      // The client went away mid-download (the response closed before the
      // blob was all sent): there is no one to answer, and nothing went
      // wrong here. A blob that cannot be read fails with its own error.
      if ((error as NodeJS.ErrnoException).code === "ERR_STREAM_PREMATURE_CLOSE") return;
      throw error;
    },
  );
}

/**
 * The plain HTTP byte routes (docs/protocol.md#byte-routes): a worker's
 * upload of a task artifact, and downloads of artifacts, a task's input, its
 * dependencies' outputs and its result.
 */
export function byteRoutes(app: ByteRouteDeps): PlainRoute[] {
  /** A task's input or result bytes (match: task id, "input" or "result"). */
  const taskBytes = (pattern: RegExp): PlainRoute => ({
    methods: ["GET", "HEAD"],
    pattern,
    roles: reader,
    what: "download a task's input or result",
    async handle({ req, res, match }) {
      const [, id = "", which] = match;
      if (!isUuid(id)) throw invalid("task id must be a UUID");
      const task = await app.tasks.get(id);
      const ref = which === "input" ? task.input : task.result;
      if (!ref) {
        throw new DomainError("not_found", "NOT_FOUND", `task ${id} has no ${which}`);
      }
      await sendArtifact(app, req, res, await app.artifacts.get(ref.artifactId));
    },
  });
  const reader = ["client", "worker"] as const;
  return [
    {
      methods: ["PUT"],
      pattern: /^\/tasks\/([^/]+)\/artifacts\/([^/]*)$/,
      roles: ["worker"],
      what: "upload a task's artifact",
      actsFor: (req) => [header(req, "x-worker-id")],
      async handle({ req, res, match, body }) {
        const [, taskId = "", rawName = ""] = match;
        let filename: string;
        try {
          filename = decodeURIComponent(rawName);
        } catch {
          throw invalid("filename is not valid percent-encoding", "INVALID_FILENAME");
        }
        const size = header(req, "content-length");
        const attemptText = header(req, "x-task-attempt");
        if (!/^\d{1,9}$/.test(attemptText)) {
          throw invalid("X-Task-Attempt must be the attempt number in decimal digits, e.g. 1");
        }
        const kindText = header(req, "x-artifact-kind").toUpperCase();
        if (kindText !== "" && kindText !== "OUTPUT" && kindText !== "CHECKPOINT") {
          throw invalid("X-Artifact-Kind must be output or checkpoint (or absent: output)");
        }
        const row = await storeUpload(
          app,
          {
            taskId: isUuid(taskId) ? taskId : `invalid:${taskId.slice(0, 40)}`,
            workerId: header(req, "x-worker-id"),
            attempt: Number(attemptText),
            leaseToken: header(req, "x-lease-token"),
            filename,
            contentType: header(req, "content-type"),
            kind: kindText === "CHECKPOINT" ? "CHECKPOINT" : "OUTPUT",
            sha256: header(req, "x-content-sha256").toLowerCase(),
            sizeBytes: size === "" ? undefined : Number(size),
          },
          body,
        );
        const ref = toArtifactRefJson(row, app.config.publicUrl);
        res.setHeader("location", ref.uri);
        sendJson(res, 201, {
          artifact_id: ref.artifactId,
          uri: ref.uri,
          sha256: ref.sha256,
          size_bytes: ref.sizeBytes,
        });
      },
    },
    {
      methods: ["GET", "HEAD"],
      pattern: /^\/artifacts\/([^/]+)\/download$/,
      roles: reader,
      what: "download an artifact",
      async handle({ req, res, match }) {
        const id = match[1] ?? "";
        if (!isUuid(id)) throw invalid("artifact id must be a UUID");
        await sendArtifact(app, req, res, await app.artifacts.get(id));
      },
    },
    taskBytes(/^\/tasks\/([^/]+)\/(input|result)$/),
    {
      // One of the task's dependency_outputs by its name, `<ref or task
      // id>/<filename>` (tasks/outputs.ts): the worker contract's input
      // route, for the inputs a task takes from its dependencies.
      methods: ["GET", "HEAD"],
      pattern: /^\/tasks\/([^/]+)\/input\/([^/]+(?:\/[^/]+)?)$/,
      roles: reader,
      what: "download a task's dependency output",
      async handle({ req, res, match }) {
        const [, id = "", raw = ""] = match;
        if (!isUuid(id)) throw invalid("task id must be a UUID");
        let name: string;
        try {
          // `split/scene.txt`, or the name as one encoded segment (`split%2Fscene.txt`).
          name = decodeURIComponent(raw);
        } catch {
          throw invalid("the output name is not valid percent-encoding");
        }
        const task = await app.tasks.get(id);
        const outputs = (await app.tasks.dependencyOutputs([task])).get(task.id) ?? {};
        const artifactId = Object.hasOwn(outputs, name) ? outputs[name] : undefined;
        if (!artifactId) {
          throw new DomainError(
            "not_found",
            "NOT_FOUND",
            `task ${id} has no dependency output ${JSON.stringify(name.slice(0, 300))}`,
          );
        }
        await sendArtifact(app, req, res, await app.artifacts.get(artifactId));
      },
    },
    // The director contract's route (under /api/mesh) for the same result bytes.
    taskBytes(/^\/api\/mesh\/tasks\/([^/]+)\/(result)$/),
  ];
}
