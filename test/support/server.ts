import { afterAll, beforeAll } from "vitest";
import type { Config } from "../../src/config.js";
import { listen, type RunningServer } from "../../src/server.js";
import { createTestDatabase, type TestDatabase } from "./database.js";
import { appOn } from "./harness.js";

/**
 * A real coordinator listening on 127.0.0.1:0 over a fresh database for the
 * test file that calls this; its `url` is set once `beforeAll` has run. With
 * `auth: "on"`, `adminToken` is an admin token made on that database.
 */
export function useListeningServer(overrides: Partial<Config> = {}): {
  readonly url: string;
  readonly adminToken: string;
} {
  let tdb: TestDatabase;
  let server: RunningServer | undefined;
  let adminToken = "";
  beforeAll(async () => {
    tdb = await createTestDatabase();
    const app = appOn(tdb.database, overrides);
    adminToken = (await app.tokens.create("test-admin", "admin")).secret;
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
  };
}
