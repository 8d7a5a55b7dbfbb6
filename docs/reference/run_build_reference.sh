#!/usr/bin/env bash
# `bazel run //docs:api [OUT_DIR]`: the API reference into OUT_DIR/html
# (default docs/api/html in the repository; not committed).
set -euo pipefail
cd "${BUILD_WORKSPACE_DIRECTORY:?run me with bazel run //docs:api}"
exec bash docs/reference/build_reference.sh "${1:-docs/api}"
