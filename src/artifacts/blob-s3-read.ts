import { Readable } from "node:stream";
import { GetObjectCommand, type S3Client } from "@aws-sdk/client-s3";
import { unavailable } from "./blob-s3-calls.js";

/**
 * The bytes of `key`, `start`..`end` inclusive when a range is given, as a
 * stream returned at once (GetObject on `client`, a client of its own: a
 * download holds its socket while its reader is slow). A download whose
 * reader takes nothing and whose response brings nothing for `idleMs` ends
 * with an error, its socket freed; a response that ignores the range, or
 * ends short, is an error too, never other or fewer bytes.
 */
export function readObject(
  client: S3Client,
  bucket: string,
  key: string,
  range: { start: number; end: number } | undefined,
  idleMs: number,
): Readable {
  const abort = new AbortController();
  let body: Readable | undefined;
  let finished = false;
  // Refreshed whenever the reader asks for more or S3 brings some: a
  // reader that stalls (or an S3 that does) cannot hold a socket forever.
  const idle = setTimeout(() => {
    fail(Object.assign(new Error(`no bytes moved for ${idleMs} ms`), { name: "TimeoutError" }));
  }, idleMs);
  idle.unref();
  const out = new Readable({
    read() {
      idle.refresh();
      body?.resume();
    },
    destroy(error, callback) {
      finished = true;
      clearTimeout(idle);
      abort.abort();
      body?.destroy();
      callback(error);
    },
  });
  const fail = (error: unknown) => {
    if (finished) return;
    finished = true;
    out.destroy(unavailable("GetObject", error));
  };
  // Async, so that even a throw of the client ends the stream, not the caller.
  const get = async () =>
    client.send(
      new GetObjectCommand({
        Bucket: bucket,
        Key: key,
        Range: range ? `bytes=${range.start}-${range.end}` : undefined,
      }),
      { abortSignal: abort.signal },
    );
  get().then((response) => {
    const stream = response.Body as Readable;
    body = stream;
    if (finished) {
      stream.destroy();
      return;
    }
    // A server that ignores Range answers 200 with the whole object:
    // its first bytes are not the ones asked for.
    if (range && !response.ContentRange?.startsWith(`bytes ${range.start}-`)) {
      stream.destroy();
      fail(
        new Error(
          `asked for bytes ${range.start}-${range.end}, got Content-Range ${response.ContentRange ?? "(none)"}`,
        ),
      );
      return;
    }
    // What the server says it sends, or what was asked: never more than
    // asked (a server that ignores part of a Range), never less (a
    // response cut short is an error, not a shorter artifact).
    let left = range ? range.end - range.start + 1 : (response.ContentLength ?? Infinity);
    stream.on("data", (data: Buffer) => {
      if (finished) return;
      idle.refresh();
      const piece = data.byteLength > left ? data.subarray(0, left) : data;
      left -= piece.byteLength;
      const more = out.push(piece);
      if (left === 0) {
        finished = true;
        clearTimeout(idle);
        out.push(null);
        stream.destroy();
      } else if (!more) stream.pause();
    });
    stream.once("end", () => {
      if (finished) return;
      if (left !== Infinity && left > 0) {
        fail(new Error(`the response ended ${left} bytes short`));
        return;
      }
      finished = true;
      clearTimeout(idle);
      out.push(null);
    });
    stream.once("error", fail);
  }, fail);
  return out;
}
