#!/usr/bin/env bash
# The TorchScript example (examples/train_torchscript.py): PyTorch scripts the
# model in a process of its own, fsdp2 trains the file on 2 local ranks; the
# loss falls, every rank prints its memory_stats() with half the model's
# parameters and never all of them gathered at once (3 blocks: at most two
# and the root), and 1 rank on the same global batch prints the same losses.
# A rank started by a launcher without --model stops with one line.
set -uo pipefail
example="$1"
tmp="${TEST_TMPDIR:-/tmp}"
common=(--steps 8 --n-layer 3 --n-embd 32 --n-head 2 --block-size 32)
two=$(timeout 300 "$example" --nproc 2 --batch-size 4 "${common[@]}" 2>&1) || {
  echo "FAIL: --nproc 2 exited non-zero"; echo "$two"; exit 1; }
echo "$two"
losses() { grep -o 'step [0-9]* loss [0-9.]*' | awk '{print $4}'; }
l2=$(echo "$two" | losses)
[[ $(echo "$l2" | wc -l) -eq 8 ]] || { echo "FAIL: expected 8 step losses"; exit 1; }
first=$(echo "$l2" | head -1); last=$(echo "$l2" | tail -1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.1) }' || {
  echo "FAIL: loss did not fall ($first -> $last)"; exit 1; }
grep -q "^export: CharTransformer of [0-9]* parameters scripted to" <<<"$two" || {
  echo "FAIL: no export line"; exit 1; }
for r in 0 1; do
  line=$(grep "rank $r: memory_stats: sharded params" <<<"$two") || {
    echo "FAIL: rank $r printed no memory_stats"; exit 1; }
  # FULL_SHARD on 2 ranks: each holds about half of the parameters.
  awk '{ for (i = 1; i <= NF; ++i) {
           if ($i == "sharded" && $(i+4) == "of") { s = $(i+2); t = $(i+5) }
           if ($i == "unsharded") p = $(i+2) } }
       END { exit !(s > 0.4 * t && s < 0.6 * t && p > 0 && p < 0.9 * t) }' <<<"$line" || {
    echo "FAIL: rank $r should hold half of the parameters and gather less than all: $line"; exit 1; }
done
one=$(timeout 300 "$example" --nproc 1 --batch-size 8 "${common[@]}" 2>&1) || {
  echo "FAIL: --nproc 1 exited non-zero"; echo "$one"; exit 1; }
l1=$(echo "$one" | losses)
paste <(echo "$l1") <(echo "$l2") | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 2e-4) bad = 1 }
  END { exit bad }' || { echo "FAIL: 1 and 2 ranks differ:"; paste <(echo "$l1") <(echo "$l2"); exit 1; }
if RANK=0 WORLD_SIZE=1 timeout 60 "$example" --steps 1 >"$tmp/err" 2>&1; then
  echo "FAIL: a rank without --model ran"; exit 1; fi
grep -q "export first (--export PATH) and pass --model PATH" "$tmp/err" || {
  echo "FAIL: unclear error:"; cat "$tmp/err"; exit 1; }
echo PASS
