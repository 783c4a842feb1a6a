import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { onPostgres, postgresUrl } from "../support/database.js";

/** Runs `meshwork serve` that must fail at start-up: its exit code and everything it printed. */
function serve(args: string[], databaseUrl?: string): Promise<{ code: number; output: string }> {
  const env = { ...process.env };
  delete env.DATABASE_URL;
  if (databaseUrl) env.DATABASE_URL = databaseUrl;
  const dir = mkdtempSync(join(tmpdir(), "meshwork-startup-"));
  return new Promise((resolve) => {
    execFile(
      "node",
      [
        "bin/meshwork.js",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        join(dir, "d"),
        ...args,
      ],
      { env, timeout: 60_000 },
      (error, stdout, stderr) => {
        resolve({ code: error ? Number(error.code) : 0, output: `${stdout}${stderr}` });
      },
    );
  });
}

/** One line, no stack trace, no password. */
function expectOneLine(output: string): void {
  expect(output.trim().split("\n")).toHaveLength(1);
  expect(output).not.toMatch(/\n\s+at |node:internal/);
  expect(output).not.toContain("secretpw");
}

describe("start-up failures: one line saying what is wrong, and an exit code", () => {
  it("refuses a DATABASE_URL that is not PostgreSQL (exit 2), without repeating it", async () => {
    const { code, output } = await serve([], "mysql://root:secretpw@db.example/app");
    expect(code).toBe(2);
    expectOneLine(output);
    expect(output).toContain("DATABASE_URL must be a PostgreSQL URL");
  });

  it("says PostgreSQL cannot be reached (exit 1), without the password", async () => {
    const { code, output } = await serve([], "postgres://u:secretpw@127.0.0.1:1/app");
    expect(code).toBe(1);
    expectOneLine(output);
    expect(output).toContain("cannot reach PostgreSQL at 127.0.0.1:1 (connection refused)");
  });

  it.skipIf(!onPostgres)("says which database does not exist and what to do", async () => {
    const url = new URL(postgresUrl ?? "");
    url.pathname = "/meshwork_no_such_database";
    url.password = "secretpw";
    const { code, output } = await serve([], url.toString());
    expect(code).toBe(1);
    expectOneLine(output);
    expect(output).toContain('database "meshwork_no_such_database" does not exist: create it');
  });

  it("says --data-dir is a file", async () => {
    const file = join(mkdtempSync(join(tmpdir(), "meshwork-startup-")), "file");
    writeFileSync(file, "");
    const { code, output } = await serve(["--data-dir", file]);
    expect(code).toBe(1);
    expectOneLine(output);
    expect(output).toContain(`--data-dir ${file} is a file, not a directory`);
  });

  it("names the TLS files that will not load", async () => {
    const dir = mkdtempSync(join(tmpdir(), "meshwork-startup-"));
    const pem = join(dir, "broken.pem");
    writeFileSync(pem, "not a key\n");
    const { code, output } = await serve(["--tls-cert", pem, "--tls-key", pem]);
    expect(code).toBe(1);
    expectOneLine(output);
    expect(output).toContain(`cannot use the TLS certificate ${pem} with the key ${pem}`);
  });
});

describe("the command line", () => {
  const meshwork = (args: string[]) =>
    new Promise<{ code: number; stdout: string }>((resolve) => {
      execFile("node", ["bin/meshwork.js", ...args], { timeout: 60_000 }, (error, stdout) => {
        resolve({ code: error ? Number(error.code) : 0, stdout });
      });
    });

  it("prints its version, the one in package.json", async () => {
    const pkg = JSON.parse(readFileSync("package.json", "utf8")) as { version: string };
    expect(await meshwork(["--version"])).toEqual({ code: 0, stdout: `meshwork ${pkg.version}\n` });
  });

  it("answers --help on each knowledge subcommand with its usage", async () => {
    for (const sub of ["export", "import", "sync"]) {
      const { code, stdout } = await meshwork(["knowledge", sub, "--help"]);
      expect(code).toBe(0);
      expect(stdout).toContain("meshwork knowledge export");
    }
  });
});
