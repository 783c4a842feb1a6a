import { createHash } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import { rename, rm, stat } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { finished } from "node:stream/promises";
import { toJson } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import {
  type Artifact,
  ArtifactKind,
  ArtifactSchema,
  ArtifactService,
  type UploadArtifactRequest,
  VerifyArtifactsResponseSchema,
} from "../../gen/meshwork/v1/artifact_pb.js";
import {
  endpointHelp,
  endpointOf,
  endpointOptions,
  type Io,
  parse,
  positionalsOf,
  runCommand,
  stdio,
  UsageError,
} from "./args.js";
import { type Endpoint, transportFor } from "./connect.js";
import { unknownSubcommand } from "./suggest.js";
import { record, when } from "./table.js";

const usage = `Usage:
  meshwork artifact get ARTIFACT_ID [-o FILE]
  meshwork artifact put FILE [--content-type TYPE] [--filename NAME]
  meshwork artifact verify

'get' downloads an artifact (DownloadArtifact) to FILE, or to stdout without
-o, and checks its SHA-256 and size against the coordinator's record: on a
mismatch FILE is not written (stdout has already been) and the exit code is 1.
With -o, --json prints the artifact's record.
A task's input and result ids are in 'meshwork task get TASK_ID'.

'put' uploads FILE as an INPUT artifact (UploadArtifact without a task) and
prints its id alone on stdout; pass it to 'meshwork task create
--input-artifact ID', or use 'task create --input FILE' to do both at once.
Outputs and checkpoints of a task can only be uploaded by the worker holding
its lease, so 'put' takes no --task.

'verify' (admin token) has the coordinator read every stored blob and check
that it hashes to its SHA-256 (VerifyArtifacts). It prints each corrupt blob
with the artifacts that hold it, then the counts; the exit code is 1 when any
is corrupt. A corrupt blob is refused to downloads until the same bytes are
uploaded again. With --json, one JSON line per message.

${endpointHelp}`;

const filenamePattern = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}$/;

/**
 * Uploads a file as an INPUT artifact, declaring its SHA-256 and size so
 * that the coordinator refuses bytes that changed on the way.
 */
export async function uploadInput(
  endpoint: Endpoint,
  path: string,
  meta: { contentType?: string | undefined; filename?: string | undefined } = {},
): Promise<Artifact> {
  const size = (await stat(path)).size;
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  const sha256 = hash.digest("hex");
  const filename =
    meta.filename ??
    basename(path)
      .replace(/[^A-Za-z0-9._-]/g, "_")
      .replace(/^\./, "_");
  if (!filenamePattern.test(filename)) {
    throw new UsageError(
      `--filename must be 1-255 characters of A-Z a-z 0-9 . _ -, not starting with a dot`,
    );
  }
  async function* messages(): AsyncGenerator<UploadArtifactRequest> {
    yield {
      $typeName: "meshwork.v1.UploadArtifactRequest",
      payload: {
        case: "header",
        value: {
          $typeName: "meshwork.v1.UploadArtifactHeader",
          taskId: "",
          workerId: "",
          attempt: 0,
          leaseToken: "",
          filename,
          contentType: meta.contentType ?? "application/octet-stream",
          kind: ArtifactKind.INPUT,
          sha256,
          sizeBytes: BigInt(size),
        },
      },
    };
    for await (const chunk of createReadStream(path, { highWaterMark: 256 * 1024 })) {
      yield {
        $typeName: "meshwork.v1.UploadArtifactRequest",
        payload: { case: "chunk", value: chunk as Buffer },
      };
    }
  }
  const res = await createClient(ArtifactService, transportFor(endpoint)).uploadArtifact(
    messages(),
  );
  if (!res.artifact) throw new Error("the coordinator answered without the artifact");
  return res.artifact;
}

/** Streams an artifact to `out`; returns its record and what arrived (SHA-256, size). */
async function download(endpoint: Endpoint, artifactId: string, out: NodeJS.WritableStream) {
  let artifact: Artifact | undefined;
  let size = 0n;
  const hash = createHash("sha256");
  const stream = createClient(ArtifactService, transportFor(endpoint)).downloadArtifact({
    artifactId,
  });
  for await (const res of stream) {
    artifact ??= res.artifact;
    if (res.chunk.length === 0) continue;
    hash.update(res.chunk);
    size += BigInt(res.chunk.length);
    if (!out.write(res.chunk)) await new Promise((resolve) => out.once("drain", resolve));
  }
  if (!artifact) throw new Error("the coordinator sent no artifact record");
  return { artifact, sha256: hash.digest("hex"), size };
}

/** `meshwork artifact …`; returns the exit code. */
export async function artifactCommand(argv: string[], io: Io = stdio): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === undefined || sub === "--help" || sub === "-h" || sub === "help") {
    (sub === undefined ? io.err : io.out).write(usage);
    return sub === undefined ? 2 : 0;
  }
  const prefix = `meshwork artifact ${sub}`;
  return runCommand(prefix, io, async () => {
    if (sub === "get") {
      const { values, positionals } = parse(rest, {
        ...endpointOptions,
        output: { type: "string", short: "o" },
      });
      if (values.help) return help(io);
      const [id = ""] = positionalsOf(positionals, ["ARTIFACT_ID"]);
      const endpoint = endpointOf(values);
      const file = values.output;
      if (file === undefined || file === "-") {
        if (values.json) throw new UsageError("--json needs -o FILE: stdout carries the bytes");
        check(await download(endpoint, id, io.out));
        return 0;
      }
      const tmp = join(dirname(file), `.${basename(file)}.${process.pid}.part`);
      const sink = createWriteStream(tmp, { flags: "wx" });
      try {
        const got = await download(endpoint, id, sink);
        sink.end();
        await finished(sink);
        check(got);
        await rename(tmp, file);
        if (values.json) io.out.write(`${JSON.stringify(toJson(ArtifactSchema, got.artifact))}\n`);
        else io.err.write(`wrote ${got.size} bytes to ${file} (sha256 ${got.sha256}, verified)\n`);
        return 0;
      } finally {
        sink.destroy();
        await rm(tmp, { force: true });
      }
    }
    if (sub === "put") {
      const { values, positionals } = parse(rest, {
        ...endpointOptions,
        "content-type": { type: "string" },
        filename: { type: "string" },
      });
      if (values.help) return help(io);
      const [path = ""] = positionalsOf(positionals, ["FILE"]);
      const artifact = await uploadInput(endpointOf(values), path, {
        contentType: values["content-type"],
        filename: values.filename,
      });
      if (values.json) {
        io.out.write(`${JSON.stringify(toJson(ArtifactSchema, artifact))}\n`);
      } else {
        io.out.write(`${artifact.artifactId}\n`);
        io.err.write(describe(artifact));
      }
      return 0;
    }
    if (sub === "verify") {
      const { values, positionals } = parse(rest, endpointOptions);
      if (values.help) return help(io);
      positionalsOf(positionals, []);
      const client = createClient(ArtifactService, transportFor(endpointOf(values)));
      let corrupt = 0;
      for await (const res of client.verifyArtifacts({})) {
        if (values.json) {
          io.out.write(`${JSON.stringify(toJson(VerifyArtifactsResponseSchema, res))}
`);
        }
        if (res.result.case === "corrupt") {
          corrupt++;
          const c = res.result.value;
          if (!values.json) {
            io.out.write(
              `corrupt  ${c.sha256}  ${c.sizeBytes} bytes, reads as ${c.actualSha256 || "(unreadable)"}; artifacts ${c.artifactIds.join(", ")}\n`,
            );
          }
        } else if (res.result.case === "summary" && !values.json) {
          const t = res.result.value;
          io.err.write(
            `checked ${t.checked} blobs (${t.bytes} bytes): ${t.corrupt} corrupt, ${t.missing} missing from this coordinator's store\n`,
          );
        }
      }
      return corrupt > 0 ? 1 : 0;
    }
    throw unknownSubcommand(sub, ["get", "put", "verify"], "meshwork artifact");
  });
}

function help(io: Io): number {
  io.out.write(usage);
  return 0;
}

function check(got: { artifact: Artifact; sha256: string; size: bigint }): void {
  if (got.sha256 !== got.artifact.sha256 || got.size !== got.artifact.sizeBytes) {
    throw new Error(
      `checksum mismatch: got ${got.size} bytes with sha256 ${got.sha256}, expected ${got.artifact.sizeBytes} bytes with sha256 ${got.artifact.sha256}`,
    );
  }
}

/** The artifact as aligned "key: value" lines. */
export function describe(a: Artifact): string {
  return record([
    ["artifact", a.artifactId],
    ["kind", ArtifactKind[a.kind] ?? String(a.kind)],
    ["filename", a.filename],
    ["size", `${a.sizeBytes} bytes`],
    ["sha256", a.sha256],
    ["content type", a.contentType],
    ["task", a.taskId || "-"],
    ["created", when(a.createdAt)],
  ]);
}
