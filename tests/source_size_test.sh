#!/bin/sh
# Fails when a C++ source file of core/ or c_api/ (the arguments) has more
# than 600 lines: a file that large holds more than one job; split it by
# responsibility (see docs/design.md).
set -eu
limit=600
count=0
too_long=""
for f in "$@"; do
  count=$((count + 1))
  lines=$(wc -l < "$f")
  if [ "$lines" -gt "$limit" ]; then
    too_long="$too_long  $f: $lines lines\n"
  fi
done
if [ "$count" -lt 50 ]; then
  echo "source_size_test: only $count files given; the filegroups are missing files" >&2
  exit 1
fi
if [ -n "$too_long" ]; then
  printf "source_size_test: over %d lines:\n$too_long" "$limit" >&2
  exit 1
fi
echo "source_size_test: $count files, none over $limit lines"
