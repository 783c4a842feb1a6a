import { execFileSync, spawnSync } from "node:child_process";
import { cpSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { fileURLToPath } from "node:url";

/** Debian's Python, the one with python3-grpcio and python3-protobuf. */
export const python = "/usr/bin/python3";

const apt =
  "apt-get install python3-grpcio python3-protobuf python3-venv python3-pip python3-setuptools";

function missingFor(what: string, checks: [string, string][]): string[] {
  const missing = checks
    .filter(([code]) => spawnSync(python, ["-c", code]).status !== 0)
    .map(([, name]) => name);
  if (missing.length > 0) {
    console.warn(`skipping ${what}: missing ${missing.join(", ")}; ${apt}`);
  }
  return missing;
}

/**
 * What the meshwork Python package (clients/python, stubs committed) needs
 * to run from a checkout and this machine lacks: an empty list when
 * /usr/bin/python3 imports grpc and protobuf. When something is missing,
 * says so with a console.warn naming `what` is skipped.
 */
export function missingForPythonGrpc(what: string): string[] {
  return missingFor(what, [
    ["import grpc, google.protobuf", `${python} with grpc (python3-grpcio, python3-protobuf)`],
  ]);
}

/** As missingForPythonGrpc, plus what installing the package into a venv needs. */
export function missingForPythonPackage(what: string): string[] {
  return missingFor(what, [
    ["import grpc, google.protobuf", `${python} with grpc (python3-grpcio, python3-protobuf)`],
    ["import venv, ensurepip", "venv (python3-venv)"],
    ["import pip", "pip (python3-pip)"],
    ["import setuptools", "setuptools (python3-setuptools)"],
  ]);
}

/** A virtual environment with the meshwork package installed; `python` is its interpreter. */
export interface PythonPackage {
  readonly python: string;
  remove(): void;
}

/**
 * Installs clients/python as its README says, offline, into a new venv
 * that sees Debian's grpcio and protobuf:
 * `python3 -m venv --system-site-packages` then `pip install
 * --no-build-isolation --no-index`. From a copy of the folder, so that the
 * in-tree build (build/, *.egg-info) never races another test's.
 */
export function installPythonPackage(): PythonPackage {
  const dir = mkdtempSync(join(tmpdir(), "meshwork-pypkg-"));
  const source = fileURLToPath(new URL("../../clients/python/", import.meta.url));
  const skip = new Set(["build", "__pycache__"]);
  cpSync(source, join(dir, "src"), {
    recursive: true,
    filter: (path) => !skip.has(basename(path)) && !path.endsWith(".egg-info"),
  });
  const venv = join(dir, "venv");
  try {
    execFileSync(python, ["-m", "venv", "--system-site-packages", venv], { stdio: "pipe" });
    execFileSync(
      join(venv, "bin", "pip"),
      ["install", "--quiet", "--no-build-isolation", "--no-index", join(dir, "src")],
      { stdio: "pipe", env: { ...process.env, PIP_DISABLE_PIP_VERSION_CHECK: "1" } },
    );
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    const e = error as { stderr?: Buffer; message: string };
    throw new Error(`installing clients/python failed: ${e.stderr?.toString() ?? e.message}`);
  }
  return {
    python: join(venv, "bin", "python"),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}
