import { createClient, createRouterTransport } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TaskService } from "../../gen/meshwork/v1/task_pb.js";
import type { App } from "../../src/app.js";
import { createRoutes, rpcInterceptors } from "../../src/server.js";
import { within } from "../support/bounded.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { appOn } from "../support/harness.js";

// Two coordinator replicas on one PostgreSQL: a token revoked through one is
// refused by the other within a second (each trusts a lookup for 500 ms).
describe.skipIf(!onPostgres)("token revocation across replicas", () => {
  let tdb: TestDatabase;
  const apps: App[] = [];
  beforeAll(async () => {
    tdb = await createTestDatabase();
    apps.push(appOn(tdb.database, { auth: "on" }), appOn(await tdb.reopen(), { auth: "on" }));
  });
  afterAll(() => tdb.drop());

  const tasks = (app: App, token: string) =>
    createClient(
      TaskService,
      createRouterTransport(createRoutes(app), {
        router: { interceptors: rpcInterceptors(app) },
        transport: {
          interceptors: [
            (next) => (req) => {
              req.header.set("authorization", `Bearer ${token}`);
              return next(req);
            },
          ],
        },
      }),
    );

  it("refuses on replica B a token revoked on replica A", async () => {
    const [a, b] = apps as [App, App];
    const { secret } = await a.tokens.create("replicated", "client");
    expect((await outcome(tasks(b, secret).listTasks({}))).code).toBe("ok"); // B caches it as valid
    await a.tokens.revoke({ name: "replicated" });
    await new Promise((r) => setTimeout(r, 1000));
    expect((await outcome(tasks(b, secret).listTasks({}))).code).toBe("Unauthenticated");
  });
});

// A stream holds its token: revoked through one replica, the streams it
// holds on another end within a second (each replica checks the tokens of
// its open streams every half second).
describe.skipIf(!onPostgres)("streams of a revoked token across replicas", () => {
  let tdb: TestDatabase;
  const apps: App[] = [];
  beforeAll(async () => {
    tdb = await createTestDatabase();
    apps.push(appOn(tdb.database, { auth: "on" }), appOn(await tdb.reopen(), { auth: "on" }));
  });
  afterAll(async () => {
    for (const a of apps) a.guard.stop();
    await tdb.drop();
  });

  const tasksOn = (app: App, token: string) =>
    createClient(
      TaskService,
      createRouterTransport(createRoutes(app), {
        router: { interceptors: rpcInterceptors(app) },
        transport: {
          interceptors: [
            (next) => (req) => {
              req.header.set("authorization", `Bearer ${token}`);
              return next(req);
            },
          ],
        },
      }),
    );

  it("ends on replica B a WatchTask whose token was revoked on replica A", async () => {
    const [a, b] = apps as [App, App];
    const { secret } = await a.tokens.create("watcher", "client");
    const { task } = await tasksOn(b, secret).createTask({ workload: "revoked-watch" });
    const watching = outcome(
      (async () => {
        for await (const _ of tasksOn(b, secret).watchTask({ taskId: task?.taskId ?? "" }));
      })(),
    );
    await new Promise((r) => setTimeout(r, 300));
    await a.tokens.revoke({ name: "watcher" });
    expect(await within(10_000, watching)).toMatchObject({ code: "Unauthenticated" });
  });
});
