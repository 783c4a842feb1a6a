import { describe, expect, it } from "vitest";
import { functionFiles, functionsText, functionsVersion } from "../../src/db/functions.js";

// The hash of the database functions' files for each version. A replica
// applies its functions only when its version is at least the installed
// one (src/db/functions.ts): a file changed without a new version would be
// two texts under one version, and replicas of both would undo each other.
// Changing a file in src/leases/sql/*.sql: raise functionsVersion and add
// its hash here.
const hashes: Record<number, string> = {
  1: "1ac462b9a5c12137ee09989dafb1704f429e5a477d4b8968edad233f512d1f1e",
};

describe("database functions", () => {
  it("have a new version for every change of their text", () => {
    expect({ version: functionsVersion, hash: functionsText().hash }).toEqual({
      version: functionsVersion,
      hash: hashes[functionsVersion],
    });
  });

  it("are every .sql file of src/leases/sql, each once", async () => {
    const { readdirSync } = await import("node:fs");
    const onDisk = readdirSync(new URL("../../src/leases/sql/", import.meta.url))
      .filter((f) => f.endsWith(".sql"))
      .sort();
    expect([...functionFiles].sort()).toEqual(onDisk);
  });
});
