#!/usr/bin/env bash
# The API reference: Doxygen over the public C and C++ headers (their plain
# comments read through doxygen_filter.py) and the Python package's
# docstrings (python_reference.py).
#   build_reference.sh OUT_DIR    writes OUT_DIR/html/index.html (C, C++) and
#                                 OUT_DIR/html/python.html
#   build_reference.sh --check    the same into a scratch folder; fails,
#                                 listing them, on any public symbol without
#                                 a comment or docstring, or a Doxygen warning
# Run from the repository root (bazel run //docs:api and the test do).
set -euo pipefail
check=0
if [[ "${1:-}" == "--check" ]]; then
  check=1; out=$(mktemp -d "${TEST_TMPDIR:-/tmp}/api.XXXXXX")
else
  out="${1:?usage: build_reference.sh OUT_DIR | --check}"
  rm -rf "$out/html"
fi
command -v doxygen >/dev/null || {
  echo "doxygen is not installed (scripts/setup.sh installs Debian's)" >&2; exit 1; }
mkdir -p "$out"
warnings=$(mktemp); dlog=$(mktemp)
# python3 here is the system's (the filter needs nothing else); Bazel's test
# environment has /usr/bin first.
{ cat docs/reference/Doxyfile
  echo "OUTPUT_DIRECTORY = $out"
  echo "WARN_LOGFILE = $warnings"
} | doxygen - >"$dlog" 2>&1 || { cat "$dlog" >&2; exit 1; }
status=0
if [[ -s "$warnings" ]]; then
  echo "Doxygen: $(wc -l <"$warnings") warning(s) (every public symbol needs a comment):" >&2
  sed "s#^$PWD/##" "$warnings" >&2
  status=1
fi
python3 docs/reference/python_reference.py --check --html "$out/html/python.html" \
  bindings/python/fsdp2 || status=1
if [[ $check -eq 0 ]]; then
  echo "API reference: $out/html/index.html (C, C++), $out/html/python.html (Python)"
fi
if [[ $check -eq 1 && $status -eq 0 ]]; then
  echo "PASS: every public C, C++ and Python symbol is documented"
  echo "  ($(ls "$out/html" | wc -l) pages)"
fi
exit $status
