import { readFileSync } from "node:fs";
import { request } from "node:https";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { listen, type RunningServer } from "../../src/server.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { appOn } from "../support/harness.js";
import { selfSignedCert } from "../support/tls.js";

let tdb: TestDatabase;
let server: RunningServer;
let ca: Buffer;

beforeAll(async () => {
  const { cert, key } = selfSignedCert("meshwork-tls-");
  ca = readFileSync(cert);
  tdb = await createTestDatabase();
  server = await listen(appOn(tdb.database, { tlsCert: cert, tlsKey: key }), "127.0.0.1:0");
});
afterAll(async () => {
  await server.close();
  await tdb.drop();
});

describe("TLS with a configured certificate", () => {
  it("serves Connect JSON over HTTPS with HTTP/1.1", async () => {
    expect(server.url).toMatch(/^https:/);
    const { port } = new URL(server.url);
    const res = await new Promise<{ status: number; protocol: string; body: string }>(
      (resolve, reject) => {
        const req = request(
          {
            host: "127.0.0.1",
            port,
            method: "POST",
            path: "/meshwork.v1.TaskService/CreateTask",
            ca,
            headers: { "content-type": "application/json" },
          },
          (r) => {
            let body = "";
            r.on("data", (d: Buffer) => {
              body += d.toString();
            });
            r.on("end", () =>
              resolve({ status: r.statusCode ?? 0, protocol: `HTTP/${r.httpVersion}`, body }),
            );
          },
        );
        req.on("error", reject);
        req.end(JSON.stringify({ workload: "tls" }));
      },
    );
    expect(res.status).toBe(200);
    expect(res.protocol).toBe("HTTP/1.1");
    expect(JSON.parse(res.body).task.state).toBe("TASK_STATE_PENDING");
  });

  it("serves gRPC over HTTP/2 negotiated by ALPN", async () => {
    const tasks = createClient(
      TaskService,
      createGrpcTransport({ baseUrl: server.url, nodeOptions: { ca } }),
    );
    const { task } = await tasks.createTask({ workload: "tls-grpc" });
    expect(task?.state).toBe(TaskState.PENDING);
  });
});
