import { createClient } from "@connectrpc/connect";
import { afterAll, beforeAll, expect } from "vitest";
import { type Task, TaskService, TaskState } from "../../gen/meshwork/v1/task_pb.js";
import { transportFor } from "../../src/cli/connect.js";
import type { Config } from "../../src/config.js";
import { listen, type RunningServer } from "../../src/server.js";
import { until } from "./bounded.js";
import { createTestDatabase, type TestDatabase } from "./database.js";
import { appOn } from "./harness.js";

/**
 * A real coordinator listening on 127.0.0.1:0 over a fresh database for the
 * test file that calls this; its `url` is set once `beforeAll` has run. With
 * `auth: "on"`, `adminToken` is an admin token made on that database, and
 * `workerToken` a worker token.
 */
export function useListeningServer(overrides: Partial<Config> = {}): ListeningServer {
  let tdb: TestDatabase;
  let server: RunningServer | undefined;
  let adminToken = "";
  let workerToken = "";
  beforeAll(async () => {
    tdb = await createTestDatabase();
    const app = appOn(tdb.database, overrides);
    adminToken = (await app.tokens.create("test-admin", "admin")).secret;
    workerToken = (await app.tokens.create("test-worker", "worker")).secret;
    server = await listen(app, "127.0.0.1:0");
  });
  afterAll(async () => {
    await server?.close();
    await tdb.drop();
  });
  return {
    get url() {
      if (!server) throw new Error("the server starts in beforeAll");
      return server.url;
    },
    get adminToken() {
      return adminToken;
    },
    get workerToken() {
      return workerToken;
    },
  };
}

export interface ListeningServer {
  readonly url: string;
  readonly adminToken: string;
  readonly workerToken: string;
}

/** TaskService on the server, called as its admin. */
export function adminTasks(server: ListeningServer) {
  return createClient(TaskService, transportFor({ url: server.url, token: server.adminToken }));
}

/** The task once it has ended SUCCEEDED or FAILED, waiting at most `ms`. */
export async function finishedTask(
  server: ListeningServer,
  taskId: string,
  ms = 20_000,
): Promise<Task | undefined> {
  const tasks = adminTasks(server);
  await until(async () => {
    const { task } = await tasks.getTask({ taskId });
    return task?.state === TaskState.SUCCEEDED || task?.state === TaskState.FAILED;
  }, ms);
  return (await tasks.getTask({ taskId })).task;
}

/**
 * The bytes behind an artifact URI the coordinator issued: its path fetched
 * from the test server (the URI names the configured public URL), as admin.
 */
export async function bytesAt(server: ListeningServer, uri: string): Promise<string> {
  const res = await fetch(`${server.url}${new URL(uri).pathname}`, {
    headers: { authorization: `Bearer ${server.adminToken}` },
  });
  expect(res.status).toBe(200);
  return res.text();
}
