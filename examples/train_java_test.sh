#!/usr/bin/env bash
# The Java example trains on 2 local ranks (it re-launches its own JVM), its
# loss falls, and it leaves a sharded checkpoint; bad flags exit non-zero.
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
if run --nproc 2 --bogus 1 >/dev/null 2>&1; then echo "FAIL: an unknown flag was accepted"; exit 1; fi
if run --nproc 1 --steps 1 --data /nonexistent >"$tmp/err" 2>&1; then
  echo "FAIL: a missing data file was accepted"; exit 1; fi
grep -q "cannot open token file /nonexistent" "$tmp/err" || { echo "FAIL: unclear error:"; cat "$tmp/err"; exit 1; }
echo PASS
