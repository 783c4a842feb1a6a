import { spawnSync } from "node:child_process";

/** Debian's Python, the one the gRPC example worker is run with. */
export const python = "/usr/bin/python3";

const onPath = (cmd: string) => spawnSync("sh", ["-c", `command -v ${cmd}`]).status === 0;

/**
 * What examples/python-grpc-worker needs and this machine lacks: an empty
 * list when /usr/bin/python3 imports grpc and protobuf and protoc and
 * grpc_python_plugin are on PATH. When something is missing, says so with a
 * console.warn naming `what` is skipped and the packages to install.
 */
export function missingForPythonGrpc(what: string): string[] {
  const missing = [
    spawnSync(python, ["-c", "import grpc, google.protobuf"]).status === 0
      ? ""
      : `${python} with grpc (python3-grpcio, python3-protobuf)`,
    onPath("protoc") ? "" : "protoc (protobuf-compiler)",
    onPath("grpc_python_plugin") ? "" : "grpc_python_plugin (protobuf-compiler-grpc)",
  ].filter(Boolean);
  if (missing.length > 0) {
    console.warn(
      `skipping ${what}: missing ${missing.join(", ")}; ` +
        "apt-get install python3-grpcio python3-protobuf protobuf-compiler protobuf-compiler-grpc",
    );
  }
  return missing;
}
