#!/usr/bin/env bash
# The Java example trains on 2 local ranks (it re-launches its own JVM), its
# loss falls, and it leaves a sharded checkpoint; every rank runs with tcmalloc
# unless FSDP2_ALLOCATOR=system; bad flags exit non-zero.
set -uo pipefail
jar="$PWD/$1"; app="$PWD/$2"; jni="$PWD/$3"
tmp="${TEST_TMPDIR:-/tmp}"
run() { timeout 300 java -Dfsdp2.jni="$jni" -cp "$jar:$app" Train "$@"; }
out=$(run --nproc 2 --steps 8 --ckpt-dir "$tmp/ckpt" 2>&1) || {
  echo "FAIL: Train exited non-zero"; echo "$out"; exit 1; }
echo "$out"
losses=$(echo "$out" | grep -o 'step [0-9]* loss [0-9.]*' | awk '{print $4}')
first=$(echo "$losses" | head -1); last=$(echo "$losses" | sed -n 8p)
[[ $(echo "$losses" | wc -l) -ge 8 ]] || { echo "FAIL: expected 8 step losses"; exit 1; }
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || { echo "FAIL: loss did not fall ($first -> $last)"; exit 1; }
[[ -f "$tmp/ckpt/metadata.json" ]] || { echo "FAIL: no checkpoint metadata in $tmp/ckpt"; exit 1; }
[[ $(ls "$tmp/ckpt" | grep -c safetensors) -ge 2 ]] || { echo "FAIL: expected a shard file per rank"; exit 1; }
# Every rank the launcher starts runs with the allocator (core/launch/allocator.h),
# and FSDP2_ALLOCATOR=system turns it off.
for r in 0 1; do
  grep -q "^\[rank $r\] .*rank $r of 2, allocator tcmalloc" <<<"$out" || {
    echo "FAIL: rank $r does not run with tcmalloc"; exit 1; }
done
off=$(FSDP2_ALLOCATOR=system run --nproc 2 --steps 1 2>&1) || {
  echo "FAIL: FSDP2_ALLOCATOR=system run exited non-zero"; echo "$off"; exit 1; }
[[ $(grep -c "of 2, allocator system" <<<"$off") -eq 2 ]] || {
  echo "FAIL: FSDP2_ALLOCATOR=system should leave both ranks on the system allocator:"
  echo "$off"; exit 1; }
if run --nproc 2 --bogus 1 >/dev/null 2>&1; then echo "FAIL: an unknown flag was accepted"; exit 1; fi
if run --nproc 1 --steps 1 --data /nonexistent >"$tmp/err" 2>&1; then
  echo "FAIL: a missing data file was accepted"; exit 1; fi
grep -q "cannot open token file /nonexistent" "$tmp/err" || { echo "FAIL: unclear error:"; cat "$tmp/err"; exit 1; }
echo PASS
