import { describe, expect, it } from "vitest";
import { DomainError } from "../../src/core/errors.js";
import { createStatementEvents, namedStatement, statementName } from "../../src/db/observe.js";

describe("statement events", () => {
  it("pass a database error on, but not a refusal a store threw through its transaction", () => {
    const events = createStatementEvents();
    const seen: unknown[] = [];
    events.observe({ started: () => (error) => seen.push(error) });
    const dbError = Object.assign(new Error("duplicate key"), { code: "23505" });
    events.started("insert into tasks")(dbError);
    events.started("transaction")(
      new DomainError("already_exists", "IDEMPOTENCY_KEY_REUSED", "used for another request"),
    );
    events.started("select from tasks")();
    expect(seen).toEqual([dbError, undefined, undefined]);
  });

  it("names a statement from its first characters, however long it is", () => {
    const insert = `insert into "tasks" ("id", "name") values ${Array.from(
      { length: 20_000 },
      (_, i) => `($${2 * i + 1}, $${2 * i + 2})`,
    ).join(", ")}`;
    expect(statementName(insert)).toBe("insert into tasks");
    expect(namedStatement(insert)).toBe("insert into tasks");
    expect(statementName('select "id" from "workers" where "id" = $1')).toBe("select from workers");
  });

  it("names the table a statement reads, not the now() of an extract before it", () => {
    expect(
      statementName(`select path, usage * power(0.5,
        greatest(0, extract(epoch from now() - updated_at)) * 1000 / $1::float8) as usage
      from share_usage`),
    ).toBe("select from share_usage");
    expect(statementName("select * from meshwork_claim_batch($1::jsonb, $2::jsonb)")).toBe(
      "select meshwork_claim_batch",
    );
  });
});
