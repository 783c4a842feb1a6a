import { createHash } from "node:crypto";
import { open, rm } from "node:fs/promises";
import { TaskError } from "./errors.js";
import { retrying } from "./rpc.js";
import type { Running, Session } from "./session.js";
import { traceHeaders } from "./trace.js";

// A task's input, downloaded under its lease: `ctx.input()` and `ctx.saveInput(path)`.

/**
 * Streams the input to `sink` (started again from scratch after a
 * transient failure) and checks its SHA-256; resolves with its size.
 */
async function download(
  s: Session,
  entry: Running,
  sink: { reset(): Promise<void>; write(chunk: Uint8Array): Promise<void> },
): Promise<number> {
  const ref = entry.claim.input;
  if (!ref?.artifactId) {
    throw new TaskError("NoInput", "the task has no input", { retryable: false });
  }
  const { digest, size } = await retrying(
    async () => {
      await sink.reset();
      const hash = createHash("sha256");
      let size = 0;
      for await (const m of s.artifacts.downloadArtifact(
        { artifactId: ref.artifactId },
        { signal: entry.abort.signal, headers: traceHeaders(entry.claim) },
      )) {
        hash.update(m.chunk);
        size += m.chunk.byteLength;
        await sink.write(m.chunk);
      }
      return { digest: hash.digest("hex"), size };
    },
    { signal: entry.abort.signal },
  );
  if (digest !== ref.sha256.toLowerCase()) {
    throw new TaskError("InputChecksumMismatch", "the input's SHA-256 is not the claim's");
  }
  return size;
}

/** The input's bytes, checked (`ctx.input()`). */
export async function inputBytes(s: Session, entry: Running): Promise<Uint8Array> {
  let chunks: Uint8Array[] = [];
  await download(s, entry, {
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

/** The input streamed into the file at `path`, checked, removed unless whole (`ctx.saveInput`). */
export async function saveInput(s: Session, entry: Running, path: string): Promise<number> {
  // Nothing is opened (so nothing already at `path` is touched) for a task
  // without input or a lease that has ended.
  if (!entry.claim.input?.artifactId) {
    throw new TaskError("NoInput", "the task has no input", { retryable: false });
  }
  entry.abort.signal.throwIfAborted();
  const file = await open(path, "w");
  let at = 0;
  let saved = false;
  try {
    const size = await download(s, entry, {
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
