import { describe, expect, it } from "vitest";
import { postgresPlace, postgresTarget } from "../../src/db/database.js";

describe("a PostgreSQL URL's target", () => {
  it("is the URL itself over TCP", () => {
    for (const url of [
      "postgres://meshwork:secret@db.internal:6543/fleet",
      "postgresql://127.0.0.1/test?sslmode=require",
      // A host parameter that is a name, not a directory, is left to postgres.js.
      "postgres://u@localhost/test?host=db.internal",
      "not a url",
    ]) {
      expect(postgresTarget(url)).toEqual({ url });
    }
  });

  it("is the directory's socket for libpq's host parameter, taken out of the URL", () => {
    expect(postgresTarget("postgresql://u@localhost/test?host=/var/run/postgresql")).toEqual({
      url: "postgresql://u@localhost/test",
      path: "/var/run/postgresql/.s.PGSQL.5432",
    });
    expect(
      postgresTarget("postgres://u@localhost:5433/test?sslmode=disable&host=%2Ftmp%2F"),
    ).toEqual({
      url: "postgres://u@localhost:5433/test?sslmode=disable",
      path: "/tmp/.s.PGSQL.5433",
    });
  });

  it("is the directory's socket for a percent-encoded directory as the host", () => {
    const url = "postgresql://u@%2Fvar%2Frun%2Fpostgresql:5434/test";
    expect(postgresTarget(url)).toEqual({ url, path: "/var/run/postgresql/.s.PGSQL.5434" });
  });

  it("is named in the start-up output without the user or password", () => {
    expect(postgresPlace("postgres://meshwork:secret@db.internal:6543/fleet")).toBe(
      "db.internal:6543/fleet",
    );
    expect(postgresPlace("postgresql://u:secret@localhost/test?host=/var/run/postgresql")).toBe(
      "/var/run/postgresql/.s.PGSQL.5432/test",
    );
  });
});
