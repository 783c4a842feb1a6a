import { mkdtempSync, writeFileSync } from "node:fs";
import * as http2 from "node:http2";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ArtifactService } from "../../gen/meshwork/v1/artifact_pb.js";
import { FleetService } from "../../gen/meshwork/v1/fleet_pb.js";
import { StreamLeasesRequestSchema } from "../../gen/meshwork/v1/lease_pb.js";
import type { App } from "../../src/app.js";
import { uploadInput } from "../../src/cli/artifact.js";
import { listen, type RunningServer } from "../../src/server.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { appOn } from "../support/harness.js";

/** What the coordinator logged, by level, while clients went away mid-call. */
let tdb: TestDatabase;
let app: App;
let server: RunningServer;
const lines: { level: string; args: unknown[] }[] = [];

beforeAll(async () => {
  tdb = await createTestDatabase();
  app = appOn(tdb.database);
  for (const level of ["debug", "info", "warn", "error"] as const) {
    const log = app.log as unknown as Record<string, (...a: unknown[]) => void>;
    const original = log[level]?.bind(log);
    log[level] = (...args: unknown[]) => {
      lines.push({ level, args });
      original?.(...args);
    };
  }
  server = await listen(app, "127.0.0.1:0");
});
afterAll(async () => {
  await server?.close();
  await tdb?.drop();
});

describe("a client that goes away mid-stream", () => {
  it("streams whose connection drops while their answers are on the way: no error, no stack", async () => {
    const { workerId } = await createClient(
      FleetService,
      createGrpcTransport({ baseUrl: server.url }),
    ).registerWorker({ capabilities: ["quiet"] });
    const message = toBinary(
      StreamLeasesRequestSchema,
      create(StreamLeasesRequestSchema, { workerId }),
    );
    const frame = Buffer.concat([Buffer.from([0, 0, 0, 0, message.length]), message]);
    for (let round = 0; round < 5; round++) {
      let socket: net.Socket | undefined;
      const session = http2.connect(server.url, {
        createConnection: () => {
          socket = net.connect({ host: "127.0.0.1", port: server.port });
          return socket;
        },
      });
      session.on("error", () => {});
      await new Promise((r) => session.once("connect", r));
      for (let i = 0; i < 50; i++) {
        const stream = session.request({
          ":method": "POST",
          ":path": "/meshwork.v1.LeaseService/StreamLeases",
          "content-type": "application/grpc",
          te: "trailers",
        });
        stream.on("error", () => {});
        stream.write(frame);
      }
      // Gone without a word, while the answers are being made.
      await new Promise((r) => setTimeout(r, 5 * round));
      socket?.destroy();
    }
    await new Promise((r) => setTimeout(r, 1500));
    expect(lines.filter((l) => l.level === "error")).toEqual([]);
    expect(lines.filter((l) => JSON.stringify(l.args).includes("    at "))).toEqual([]);
  });

  it("is logged at debug, one line without a stack, never as an error", async () => {
    const path = join(mkdtempSync(join(tmpdir(), "meshwork-quiet-")), "big.bin");
    writeFileSync(path, Buffer.alloc(32 * 1024 * 1024, 1));
    const artifact = await uploadInput({ url: server.url, token: "" }, path);
    for (let i = 0; i < 10; i++) {
      const abort = new AbortController();
      const client = createClient(ArtifactService, createGrpcTransport({ baseUrl: server.url }));
      try {
        for await (const _ of client.downloadArtifact(
          { artifactId: artifact.artifactId },
          { signal: abort.signal },
        )) {
          abort.abort();
        }
      } catch {
        // Cancelled on purpose.
      }
    }
    await new Promise((r) => setTimeout(r, 500));
    const errors = lines.filter((l) => l.level === "error");
    expect(errors).toEqual([]);
    const withStack = lines.filter((l) => JSON.stringify(l.args).includes("    at "));
    expect(withStack).toEqual([]);
  });
});
