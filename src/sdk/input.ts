import { createHash } from "node:crypto";
import { open, rm } from "node:fs/promises";
import { TaskError } from "./errors.js";
import { retrying } from "./rpc.js";
import type { Running, Session } from "./session.js";
import { traceHeaders } from "./trace.js";

// Artifacts downloaded under a task's lease: its input (`ctx.input()`,
// `ctx.saveInput(path)`) and its dependencies' outputs (`ctx.inputs`,
// inputs.ts). Every download is checked against its SHA-256.

/** An artifact to download: its id, the SHA-256 it must hash to ("" for the one its metadata gives), and its name in errors. */
export interface Source {
  artifactId: string;
  sha256: string;
  /** How errors name it, e.g. `the input` or `input "prep/out.txt"`. */
  what: string;
}

/** Where downloaded bytes go: `reset` before each try, `write` each chunk. */
interface Sink {
  reset(): Promise<void>;
  write(chunk: Uint8Array): Promise<void>;
}

/** The task's own input, or a TaskError (NoInput) when it has none. */
function inputSource(entry: Running): Source {
  const ref = entry.claim.input;
  if (!ref?.artifactId) {
    throw new TaskError("NoInput", "the task has no input", { retryable: false });
  }
  return { artifactId: ref.artifactId, sha256: ref.sha256, what: "the input" };
}

/** The TaskError for bytes that do not hash to what they should. */
function mismatch(source: Source): TaskError {
  return new TaskError(
    "InputChecksumMismatch",
    source.what === "the input"
      ? "the input's SHA-256 is not the claim's"
      : `the SHA-256 of ${source.what} is not its artifact's`,
  );
}

/**
 * The chunks of one download and its check: the expected SHA-256 is the
 * source's, else the artifact's metadata (in the first message). Throws
 * a TaskError (InputChecksumMismatch) after the last chunk when they differ.
 */
async function* chunksOf(s: Session, entry: Running, source: Source): AsyncGenerator<Uint8Array> {
  const hash = createHash("sha256");
  let expected = source.sha256.toLowerCase();
  for await (const m of s.artifacts.downloadArtifact(
    { artifactId: source.artifactId },
    { signal: entry.abort.signal, headers: traceHeaders(entry.claim) },
  )) {
    if (!expected && m.artifact) expected = m.artifact.sha256.toLowerCase();
    hash.update(m.chunk);
    yield m.chunk;
  }
  if (hash.digest("hex") !== expected) throw mismatch(source);
}

/** Streams `source` to `sink` (started again from scratch after a transient failure), checked; resolves with its size. */
async function download(s: Session, entry: Running, source: Source, sink: Sink): Promise<number> {
  return retrying(
    async () => {
      await sink.reset();
      let size = 0;
      for await (const chunk of chunksOf(s, entry, source)) {
        size += chunk.byteLength;
        await sink.write(chunk);
      }
      return size;
    },
    { signal: entry.abort.signal },
  );
}

/** The bytes of `source`, checked. */
export async function bytesOf(s: Session, entry: Running, source: Source): Promise<Uint8Array> {
  let chunks: Uint8Array[] = [];
  await download(s, entry, source, {
    reset: async () => {
      chunks = [];
    },
    write: async (chunk) => {
      chunks.push(chunk);
    },
  });
  const bytes = Buffer.concat(chunks);
  return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/** `source` streamed into the file at `path`, checked, removed unless whole; resolves with its size. */
export async function saveTo(
  s: Session,
  entry: Running,
  source: Source,
  path: string,
): Promise<number> {
  // Nothing is opened (so nothing already at `path` is touched) for a
  // lease that has ended.
  entry.abort.signal.throwIfAborted();
  const file = await open(path, "w");
  let at = 0;
  let saved = false;
  try {
    const size = await download(s, entry, source, {
      reset: async () => {
        at = 0;
        await file.truncate(0);
      },
      write: async (chunk) => {
        await file.write(chunk, 0, chunk.byteLength, at);
        at += chunk.byteLength;
      },
    });
    saved = true;
    return size;
  } finally {
    await file.close();
    if (!saved) await rm(path, { force: true });
  }
}

/** The chunks of `source` as they arrive, checked after the last (one try: a stream is not sent again). */
export function streamOf(s: Session, entry: Running, source: Source): AsyncIterable<Uint8Array> {
  return { [Symbol.asyncIterator]: () => chunksOf(s, entry, source) };
}

/** The input's bytes, checked (`ctx.input()`). */
export async function inputBytes(s: Session, entry: Running): Promise<Uint8Array> {
  return bytesOf(s, entry, inputSource(entry));
}

/** The input streamed into the file at `path`, checked, removed unless whole (`ctx.saveInput`). */
export async function saveInput(s: Session, entry: Running, path: string): Promise<number> {
  // A task without input opens nothing at `path`.
  return saveTo(s, entry, inputSource(entry), path);
}
