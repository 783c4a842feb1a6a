import { existsSync } from "node:fs";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Database, openDatabase } from "../../src/db/database.js";
import { rowsOf } from "../../src/db/values.js";
import { createTaskStore } from "../../src/tasks/store.js";
import { createTestDatabase, onPostgres, type TestDatabase } from "../support/database.js";
import { newTask } from "../support/fixtures.js";

// DATABASE_URL may name a Unix socket as libpq does (src/db/database.ts,
// postgresTarget): a `host` parameter that is a directory, or the directory
// percent-encoded as the host. The test server's own socket directory is
// read from it; where this machine cannot reach that directory (a server
// elsewhere), the tests are skipped.
describe.skipIf(!onPostgres)("DATABASE_URL naming a Unix socket", () => {
  let tdb: TestDatabase;
  let socketDir = "";
  let port = 5432;
  const opened: Database[] = [];

  beforeAll(async () => {
    tdb = await createTestDatabase();
    const [row] = await rowsOf<{ dirs: string; port: number }>(
      tdb.database.db,
      sql`select current_setting('unix_socket_directories') as dirs, inet_server_port() as port`,
    );
    socketDir = row?.dirs.split(",")[0]?.trim() ?? "";
    port = Number(row?.port ?? 5432);
  });
  afterAll(async () => {
    for (const d of opened) await d.close();
    await tdb?.drop();
  });

  /** The test database's URL with its host replaced by `host` and the query by `search`. */
  function socketUrl(host: string, search: string): string {
    const url = new URL(tdb.url ?? "");
    const user = url.password ? `${url.username}:${url.password}` : url.username;
    return `${url.protocol}//${user}@${host}:${port}${url.pathname}${search}`;
  }

  for (const form of ["a host parameter", "a percent-encoded host"] as const) {
    it(`connects through the socket named by ${form}, with LISTEN and the stores`, async (ctx) => {
      if (!socketDir || !existsSync(`${socketDir}/.s.PGSQL.${port}`)) ctx.skip();
      const url =
        form === "a host parameter"
          ? socketUrl("localhost", `?host=${encodeURIComponent(socketDir)}`)
          : socketUrl(encodeURIComponent(socketDir), "");
      const database = await openDatabase({ url, dataDir: "", poolSize: 2 });
      opened.push(database);
      // No server address: the session came in through a Unix socket, not TCP.
      const [session] = await rowsOf<{ address: string | null; db: string }>(
        database.db,
        sql`select inet_server_addr()::text as address, current_database() as db`,
      );
      expect(session).toEqual({ address: null, db: new URL(tdb.url ?? "").pathname.slice(1) });
      let hear: (payload: string) => void = () => {};
      const heard = new Promise<string>((resolve) => {
        hear = resolve;
      });
      await database.listen("meshwork_socket_test", (payload) => hear(payload));
      await rowsOf(
        database.db,
        sql`select pg_notify('meshwork_socket_test', 'through the socket')`,
      );
      expect(await heard).toBe("through the socket");
      const [made] = await createTaskStore(database.db).create([newTask({ workload: "socket" })]);
      const [read] = await rowsOf<{ workload: string }>(
        tdb.database.db,
        sql`select workload from tasks where id = ${made?.id}`,
      );
      expect(read?.workload).toBe("socket");
    });
  }
});
