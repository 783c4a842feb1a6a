import { tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import { describe, expect, it } from "vitest";
import { isTransientDatabaseError } from "../../src/db/faults.js";
import { postgresPlace, postgresTarget } from "../../src/db/postgres-url.js";

describe("a PostgreSQL URL's target", () => {
  it("is the URL itself over TCP", () => {
    for (const url of [
      "postgres://meshwork:s%40cret@db.internal:6543/fleet",
      "postgresql://127.0.0.1/test?sslmode=require",
      // A list of hosts is postgres.js's to read.
      "postgres://u@a,b/test",
      "not a url",
    ]) {
      expect(postgresTarget(url)).toEqual({ url });
    }
  });

  it("takes libpq's host and port parameters out of a TCP URL, into its host and port", () => {
    expect(postgresTarget("postgres://u:pw@localhost/test?host=DB.internal&port=6543")).toEqual({
      url: "postgres://u:pw@DB.internal:6543/test",
    });
    expect(postgresTarget("postgres://u@localhost:5433/test?port=5432&sslmode=require")).toEqual({
      url: "postgres://u@localhost:5432/test?sslmode=require",
    });
  });

  it("is the directory's socket for libpq's host parameter, taken out of the URL with port and sslmode", () => {
    expect(postgresTarget("postgresql://u@localhost/test?host=/var/run/postgresql")).toEqual({
      url: "postgresql://u@localhost/test",
      path: "/var/run/postgresql/.s.PGSQL.5432",
    });
    expect(
      postgresTarget(
        "postgres://u:pw@localhost:5433/test?sslmode=require&host=%2Ftmp%2F&connect_timeout=3",
      ),
    ).toEqual({
      url: "postgres://u:pw@localhost:5433/test?connect_timeout=3",
      path: "/tmp/.s.PGSQL.5433",
    });
    expect(postgresTarget("postgres://u@localhost/test?host=/tmp&port=5439")).toEqual({
      url: "postgres://u@localhost/test",
      path: "/tmp/.s.PGSQL.5439",
    });
  });

  it("is the directory's socket for a percent-encoded directory as the host", () => {
    expect(postgresTarget("postgresql://u@%2Fvar%2Frun%2Fpostgresql:5434/test")).toEqual({
      url: "postgresql://u@%2Fvar%2Frun%2Fpostgresql:5434/test",
      path: "/var/run/postgresql/.s.PGSQL.5434",
    });
    expect(postgresTarget("postgresql://u@%2Ftmp/test?sslmode=require")).toEqual({
      url: "postgresql://u@%2Ftmp/test",
      path: "/tmp/.s.PGSQL.5432",
    });
  });

  it("refuses what it cannot read as libpq would, saying nothing of the URL", () => {
    for (const [query, message] of [
      ["host=", /host parameter must name one host, not none/],
      ["port=", /port parameter must name one port, not none/],
      ["host=/a,/b", /host parameter must name one host, not a list/],
      ["port=5432,5433", /port parameter must name one port, not a list/],
      ["port=54x", /port parameter is not a port number/],
      ["port=70000", /port parameter is not a port number/],
      ["host=::1", /host parameter is not a host name or a socket directory/],
    ] as const) {
      const url = `postgres://u:secretpw@localhost/test?${query}`;
      expect(() => postgresTarget(url)).toThrow(message);
      expect(() => postgresTarget(url)).not.toThrow(/secretpw|localhost/);
    }
    expect(() => postgresTarget("postgres://u@a,b/test?port=5433")).toThrow(/list of hosts/);
  });

  it("is named in the start-up output without the user or password", () => {
    expect(postgresPlace("postgres://meshwork:secret@db.internal:6543/fleet")).toBe(
      "db.internal:6543/fleet",
    );
    expect(postgresPlace("postgres://meshwork:secret@localhost/fleet?host=db.internal")).toBe(
      "db.internal:5432/fleet",
    );
    expect(postgresPlace("postgresql://u:secret@localhost/test?host=/var/run/postgresql")).toBe(
      "/var/run/postgresql/.s.PGSQL.5432 (database test)",
    );
    expect(postgresPlace("postgres://u:secret@localhost/test?host=")).toBe(
      "the server in DATABASE_URL",
    );
  });
});

describe("a Unix socket that is not there", () => {
  it("is a transient database fault when connecting (the server stopped), and a missing file elsewhere is not", async () => {
    // What postgres.js answers while PostgreSQL is stopped: its socket file is gone.
    const sql = postgres({ path: join(tmpdir(), "meshwork-no-server/.s.PGSQL.5432"), max: 1 });
    const refused = await sql`select 1`.catch((e: unknown) => e);
    await sql.end();
    expect(refused).toMatchObject({ code: "ENOENT", syscall: "connect" });
    expect(isTransientDatabaseError(refused)).toBe(true);
    expect(isTransientDatabaseError(new Error("failed", { cause: refused }))).toBe(true);
    const open = Object.assign(new Error("ENOENT: no such file"), {
      code: "ENOENT",
      syscall: "open",
    });
    expect(isTransientDatabaseError(open)).toBe(false);
  });
});
