import { afterAll, beforeAll } from "vitest";
import { listen, type RunningServer } from "../../src/server.js";
import { createTestDatabase, type TestDatabase } from "./database.js";
import { appOn } from "./harness.js";

/**
 * A real coordinator listening on 127.0.0.1:0 over a fresh database for the
 * test file that calls this; its `url` is set once `beforeAll` has run.
 */
export function useListeningServer(): { readonly url: string } {
  let tdb: TestDatabase;
  let server: RunningServer | undefined;
  beforeAll(async () => {
    tdb = await createTestDatabase();
    server = await listen(appOn(tdb.database), "127.0.0.1:0");
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
  };
}
