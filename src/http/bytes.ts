import type * as http from "node:http";
import type * as http2 from "node:http2";
import { pipeline } from "node:stream/promises";
import type { App } from "../app.js";
import { toArtifactRefJson } from "../artifacts/convert.js";
import { storeUpload } from "../artifacts/uploads.js";
import { DomainError, invalid } from "../core/errors.js";
import { isUuid } from "../core/validate.js";
import type { ArtifactRow } from "../db/schema/index.js";
import { codeName, httpStatusOfCode, type ToClientError } from "../rpc/errors.js";
import { sendJson } from "./json.js";

type Request = http.IncomingMessage | http2.Http2ServerRequest;
type Response = http.ServerResponse | http2.Http2ServerResponse;

/** `{"error": "<code>", "message": "..."}` with the status of the error table (docs/protocol.md#errors). */
function sendError(app: App, toClientError: ToClientError, res: Response, error: unknown): void {
  const { error: e, unexpected } = toClientError(error);
  if (unexpected) app.log.error({ err: error }, "byte route failed");
  const code = codeName(e.code);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  sendJson(res, httpStatusOfCode[e.code] ?? 500, { error: code, message: e.rawMessage });
}

function header(req: Request, name: string): string {
  const v = req.headers[name];
  return (Array.isArray(v) ? v[0] : v) ?? "";
}

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
  app: App,
  req: Request,
  res: Response,
  row: ArtifactRow,
): Promise<void> {
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
  await pipeline(app.blobs.read(row.sha256, range), res as http.ServerResponse);
}

const putArtifact = /^\/tasks\/([^/]+)\/artifacts\/([^/]*)$/;
const download = /^\/artifacts\/([^/]+)\/download$/;
const taskBytes = /^\/tasks\/([^/]+)\/(input|result)$/;

/**
 * The plain HTTP byte routes (docs/protocol.md#byte-routes). Returns false when the
 * request is not for one of them.
 */
export function handleByteRoute(
  app: App,
  toClientError: ToClientError,
  req: Request,
  res: Response,
  path: string,
): boolean {
  const method = req.method ?? "GET";
  let m = putArtifact.exec(path);
  if (m && method === "PUT") {
    const [, taskId = "", rawName = ""] = m;
    (async () => {
      let filename: string;
      try {
        filename = decodeURIComponent(rawName);
      } catch {
        throw invalid("filename is not valid percent-encoding", "INVALID_FILENAME");
      }
      const size = header(req, "content-length");
      const row = await storeUpload(
        app,
        {
          taskId: isUuid(taskId) ? taskId : `invalid:${taskId.slice(0, 40)}`,
          workerId: header(req, "x-worker-id"),
          attempt: Number(header(req, "x-task-attempt") || "0"),
          leaseToken: header(req, "x-lease-token"),
          filename,
          contentType: header(req, "content-type"),
          kind:
            header(req, "x-artifact-kind").toUpperCase() === "CHECKPOINT" ? "CHECKPOINT" : "OUTPUT",
          sha256: header(req, "x-content-sha256").toLowerCase(),
          sizeBytes: size === "" ? undefined : Number(size),
        },
        req as AsyncIterable<Uint8Array>,
      );
      const ref = toArtifactRefJson(row, app.config.publicUrl);
      res.setHeader("location", ref.uri);
      sendJson(res, 201, {
        artifact_id: ref.artifactId,
        uri: ref.uri,
        sha256: ref.sha256,
        size_bytes: ref.sizeBytes,
      });
    })().catch((error: unknown) => {
      sendError(app, toClientError, res, error);
      // Stop reading a refused upload.
      if (!req.readableEnded) req.resume();
    });
    return true;
  }
  if (method !== "GET" && method !== "HEAD") return false;
  m = download.exec(path);
  if (m) {
    const id = m[1] ?? "";
    (async () => {
      if (!isUuid(id)) throw invalid("artifact id must be a UUID");
      await sendArtifact(app, req, res, await app.artifacts.get(id));
    })().catch((error: unknown) => sendError(app, toClientError, res, error));
    return true;
  }
  m = taskBytes.exec(path);
  if (m) {
    const [, id = "", which] = m;
    (async () => {
      if (!isUuid(id)) throw invalid("task id must be a UUID");
      const task = await app.tasks.get(id);
      const ref = which === "input" ? task.input : task.result;
      if (!ref) {
        throw new DomainError("not_found", "NOT_FOUND", `task ${id} has no ${which}`);
      }
      await sendArtifact(app, req, res, await app.artifacts.get(ref.artifactId));
    })().catch((error: unknown) => sendError(app, toClientError, res, error));
    return true;
  }
  return false;
}
