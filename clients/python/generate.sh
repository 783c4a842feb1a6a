#!/usr/bin/env bash
# Regenerates the package's stubs, meshwork/v1/*_pb2.py and *_pb2_grpc.py,
# from proto/meshwork with Debian's protoc and grpc_python_plugin:
#   apt-get install protobuf-compiler protobuf-compiler-grpc
# The stubs are committed; CI (.ci/run) runs this and fails on any diff.
# They land in meshwork/v1/ because protoc names the modules after the proto
# package (`from meshwork.v1 import task_pb2`), which is then this package's
# own subpackage: no import rewriting, no sys.path change.
# Not proto/grpc: stubs of it would make a `grpc` package that shadows grpcio.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto="${here}/../../proto"
out="${here}/meshwork/v1"
plugin="$(command -v grpc_python_plugin || true)"
if ! command -v protoc >/dev/null || [ -z "${plugin}" ]; then
  echo "generate.sh: needs protoc and grpc_python_plugin:" >&2
  echo "  apt-get install protobuf-compiler protobuf-compiler-grpc" >&2
  exit 1
fi
rm -f "${out}"/*_pb2.py "${out}"/*_pb2_grpc.py
mkdir -p "${out}"
# The well-known types (google/protobuf/*.proto) come with protoc; their
# Python modules with python3-protobuf.
protoc -I "${proto}" --python_out="${here}" --grpc_python_out="${here}" \
  --plugin=protoc-gen-grpc_python="${plugin}" "${proto}"/meshwork/v1/*.proto
printf '%s\n' '"""Generated from proto/meshwork/v1 by clients/python/generate.sh; do not edit."""' \
  >"${out}/__init__.py"
