import { execFile, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { onPostgres, postgresUrl } from "../support/database.js";
import { startS3, type TestS3 } from "../support/s3.js";

/** Runs `meshwork serve` that must fail at start-up: its exit code and everything it printed. */
function serve(
  args: string[],
  databaseUrl?: string,
  extraEnv: Record<string, string> = {},
): Promise<{ code: number; output: string }> {
  const env = { ...process.env, ...extraEnv };
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

/** Whether a line is one of the start-up steps logged before the failure ("connecting to …"). */
function isStepLine(line: string): boolean {
  try {
    return (JSON.parse(line) as { level?: string }).level === "info";
  } catch {
    return false;
  }
}

/** One line (after the steps it got through), no stack trace, no password. */
function expectOneLine(output: string): void {
  expect(
    output
      .trim()
      .split("\n")
      .filter((l) => !isStepLine(l)),
  ).toHaveLength(1);
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

  it("refuses a --retention that is not a duration (exit 2), flag or environment", async () => {
    for (const [args, env] of [
      [["--retention", "7"], {}],
      [[], { MESHWORK_RETENTION: "1w" }],
    ] as const) {
      const { code, output } = await serve([...args], undefined, env);
      expect(code).toBe(2);
      expectOneLine(output);
      expect(output).toContain("--retention must be 0 or a whole number with a unit");
    }
  });

  it("says PostgreSQL cannot be reached (exit 1), without the password", async () => {
    const { code, output } = await serve([], "postgres://u:secretpw@127.0.0.1:1/app");
    expect(code).toBe(1);
    expectOneLine(output);
    expect(output).toContain("cannot reach PostgreSQL at 127.0.0.1:1/app (connection refused)");
  });

  it("says a Unix socket is not there (exit 1), naming it without the password", async () => {
    const dir = mkdtempSync(join(tmpdir(), "meshwork-no-socket-"));
    const { code, output } = await serve([], `postgres://u:secretpw@localhost/app?host=${dir}`);
    expect(code).toBe(1);
    expectOneLine(output);
    expect(output).toContain(
      `cannot reach PostgreSQL at ${dir}/.s.PGSQL.5432 (database app): no socket there`,
    );
    expect(output).not.toContain("secretpw");
  });

  it("refuses a host or port parameter it cannot read (exit 2), without the URL", async () => {
    for (const [query, message] of [
      ["host=", "DATABASE_URL's host parameter must name one host, not none"],
      ["host=/a,/b", "DATABASE_URL's host parameter must name one host, not a list"],
      ["port=54x", "DATABASE_URL's port parameter is not a port number"],
      ["host=::1", "DATABASE_URL's host parameter is not a host name or a socket directory"],
    ] as const) {
      const { code, output } = await serve([], `postgres://u:secretpw@localhost/app?${query}`);
      expect(code).toBe(2);
      expectOneLine(output);
      expect(output).toContain(message);
      expect(output).not.toContain("secretpw");
    }
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

describe("start-up with --blob-store s3://…: the bucket is checked first", () => {
  let s3: TestS3;
  beforeAll(async () => {
    s3 = await startS3("meshwork-startup");
  });
  afterAll(() => s3?.close());
  const env = (overrides: Record<string, string> = {}) => ({
    ...s3.env,
    AWS_SECRET_ACCESS_KEY: "secretpw",
    ...overrides,
  });

  it("says the endpoint cannot be reached (exit 1), without the secret key", async () => {
    const { code, output } = await serve(
      ["--blob-store", "s3://nobucket/x"],
      undefined,
      env({ AWS_ENDPOINT_URL: "http://127.0.0.1:1" }),
    );
    expect(code).toBe(1);
    expectOneLine(output);
    expect(output).toBe(
      "meshwork serve: cannot reach the S3 endpoint 127.0.0.1:1 (connection refused): is it running, on that port? (AWS_ENDPOINT_URL)\n",
    );
  });

  it("says the bucket does not exist", async () => {
    const { code, output } = await serve(
      ["--blob-store", "s3://nobucket/x"],
      undefined,
      env({ AWS_SECRET_ACCESS_KEY: s3.env.AWS_SECRET_ACCESS_KEY ?? "" }),
    );
    expect(code).toBe(1);
    expectOneLine(output);
    expect(output).toContain(
      `the bucket nobucket does not exist at the S3 endpoint ${new URL(s3.endpoint).host}: create it`,
    );
  });

  it("says the keys are refused, without the secret key", async () => {
    // s3rver checks the access key id only (it does not verify SigV4 signatures).
    const { code, output } = await serve(
      ["--blob-store", `s3://${s3.bucket}/x`],
      undefined,
      env({ AWS_ACCESS_KEY_ID: "nobody" }),
    );
    expect(code).toBe(1);
    expectOneLine(output);
    expect(output).toContain("refused access to the bucket meshwork-startup (HTTP 403)");
  });

  it("refuses a MESHWORK_S3_FORCE_PATH_STYLE that is not true or false", async () => {
    const { code, output } = await serve(
      ["--blob-store", `s3://${s3.bucket}/x`],
      undefined,
      env({ MESHWORK_S3_FORCE_PATH_STYLE: "maybe" }),
    );
    expect(code).toBe(1);
    expectOneLine(output);
    expect(output).toContain("MESHWORK_S3_FORCE_PATH_STYLE must be true or false, not maybe");
  });

  it.skipIf(onPostgres)("starts when the bucket answers", async () => {
    const dir = mkdtempSync(join(tmpdir(), "meshwork-startup-"));
    const child = spawn(
      "node",
      [
        "bin/meshwork.js",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        join(dir, "d"),
        "--blob-store",
        `s3://${s3.bucket}/x`,
      ],
      { env: { ...process.env, DATABASE_URL: "", ...s3.env }, stdio: ["ignore", "pipe", "pipe"] },
    );
    let output = "";
    const listening = new Promise<void>((resolve, reject) => {
      const look = (d: Buffer) => {
        output += d.toString();
        if (output.includes("meshwork listening")) resolve();
      };
      child.stdout.on("data", look);
      child.stderr.on("data", look);
      child.on("exit", (code) => reject(new Error(`exited ${code}: ${output}`)));
    });
    try {
      await listening;
    } finally {
      child.kill("SIGTERM");
    }
    expect(output).not.toContain("NodeVersionSupportWarning");
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
