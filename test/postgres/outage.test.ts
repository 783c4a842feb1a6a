import { ConnectError } from "@connectrpc/connect";
import type postgres from "postgres";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectPostgres } from "../../src/db/postgres-client.js";
import { onPostgres } from "../support/database.js";
import { outcome } from "../support/errors.js";
import { createHarness, type Harness } from "../support/harness.js";

/**
 * A connection lost under a call (a failover, a restart, an operator's
 * pg_terminate_backend) is no bug: the client gets `unavailable` with a
 * retry hint, never `internal`, and nothing changes.
 */
describe.skipIf(!onPostgres)("a database connection lost under a call", () => {
  let h: Harness;
  let admin: postgres.Sql;
  beforeAll(async () => {
    h = await createHarness();
    admin = connectPostgres(h.db.url ?? "", { max: 2, onnotice: () => {} });
  });
  afterAll(async () => {
    await admin?.end();
    await h?.close();
  });

  it("answers unavailable with retry-after, leaves the state as it was, and the next call works", async () => {
    const { workerId } = await h.fleet.registerWorker({ name: "outage" });
    // Hold the worker's row, so that DrainWorker waits on it; then kill the
    // connection it waits on.
    const holder = await admin.reserve();
    await holder`begin`;
    await holder`select 1 from workers where id = ${workerId} for update`;
    const call = h.fleet.drainWorker({ workerId, drained: true });
    const settled = call.then(
      () => undefined,
      (e: unknown) => e,
    );
    const name = new URL(h.db.url ?? "").pathname.slice(1);
    for (let i = 0; i < 100; i++) {
      const [row] = await admin`select count(*)::int as n from pg_stat_activity
        where datname = ${name} and wait_event_type = 'Lock'`;
      if ((row?.n ?? 0) > 0) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    await admin`select pg_terminate_backend(pid) from pg_stat_activity
      where datname = ${name} and wait_event_type = 'Lock'`;
    const error = await settled;
    await holder`rollback`;
    holder.release();
    expect(error).toBeInstanceOf(ConnectError);
    expect(await outcome(Promise.reject(error))).toMatchObject({
      code: "Unavailable",
      message: "the database is unavailable for a moment; retry",
    });
    expect((error as ConnectError).metadata.get("retry-after")).toBe("1");
    expect((await h.fleet.getWorker({ workerId })).worker?.drained).toBe(false);
    expect((await h.fleet.drainWorker({ workerId, drained: true })).worker?.drained).toBe(true);
  });
});
