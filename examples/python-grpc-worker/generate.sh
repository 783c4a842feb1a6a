#!/usr/bin/env bash
# Generates the Python stubs of Meshwork's contract (proto/meshwork only) for
# worker.py, with Debian's protoc and grpc_python_plugin:
#   apt-get install python3-grpcio python3-protobuf protobuf-compiler protobuf-compiler-grpc
# Usage: generate.sh [OUT_DIR]   (default: gen/ next to this script, ignored by git)
# Not proto/grpc: stubs of it would make a `grpc` package that shadows grpcio.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto="${here}/../../proto"
out="${1:-${here}/gen}"
plugin="$(command -v grpc_python_plugin || true)"
if ! command -v protoc >/dev/null || [ -z "${plugin}" ]; then
  echo "generate.sh: needs protoc and grpc_python_plugin:" >&2
  echo "  apt-get install protobuf-compiler protobuf-compiler-grpc" >&2
  exit 1
fi
mkdir -p "${out}"
# The well-known types (google/protobuf/*.proto) come with protoc; their
# Python modules with python3-protobuf.
protoc -I "${proto}" --python_out="${out}" --grpc_python_out="${out}" \
  --plugin=protoc-gen-grpc_python="${plugin}" "${proto}"/meshwork/v1/*.proto
echo "stubs written to ${out}/meshwork/v1"
