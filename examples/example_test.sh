#!/usr/bin/env bash
# An example (C or Python; its program is the argument) trains on 2 local
# ranks, its loss falls, and it leaves a sharded checkpoint with both ranks'
# files; every rank runs with tcmalloc unless FSDP2_ALLOCATOR=system, a rank
# of an outside launcher too; bad flags exit non-zero.
set -uo pipefail
train="$1"
tmp="${TEST_TMPDIR:-/tmp}"
out=$(timeout 300 "$train" --nproc 2 --steps 8 --ckpt-dir "$tmp/ckpt" 2>&1) || {
  echo "FAIL: $train exited non-zero"; echo "$out"; exit 1; }
echo "$out"
# The step losses only ("step N loss X"; not the validation loss).
losses=$(echo "$out" | grep -o 'step [0-9]* loss [0-9.]*' | awk '{print $4}')
first=$(echo "$losses" | head -1); last=$(echo "$losses" | sed -n 8p)
[[ "$(echo "$out" | grep -o 'step [0-9]* loss' | awk '{print $2}' | tr '\n' ' ')" == "1 2 3 4 5 6 7 8 " ]] || {
  echo "FAIL: expected the losses of steps 1 to 8"; exit 1; }
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || { echo "FAIL: loss did not fall ($first -> $last)"; exit 1; }
[[ -f "$tmp/ckpt/metadata.json" ]] || { echo "FAIL: no checkpoint metadata in $tmp/ckpt"; ls -R "$tmp"; exit 1; }
[[ $(ls "$tmp/ckpt" | grep -c safetensors) -ge 2 ]] || { echo "FAIL: expected a shard file per rank"; ls "$tmp/ckpt"; exit 1; }
# Every rank the launcher starts runs with the allocator (core/launch/allocator.h),
# and FSDP2_ALLOCATOR=system turns it off.
for r in 0 1; do
  grep -q "^\[rank $r\] .*rank $r of 2, allocator tcmalloc" <<<"$out" || {
    echo "FAIL: rank $r does not run with tcmalloc"; exit 1; }
done
off=$(FSDP2_ALLOCATOR=system timeout 300 "$train" --nproc 2 --steps 1 2>&1) || {
  echo "FAIL: FSDP2_ALLOCATOR=system run exited non-zero"; echo "$off"; exit 1; }
[[ $(grep -c "of 2, allocator system" <<<"$off") -eq 2 ]] || {
  echo "FAIL: FSDP2_ALLOCATOR=system should leave both ranks on the system allocator:"
  echo "$off"; exit 1; }
# A rank an outside launcher started (torchrun-style variables, nothing
# preloaded) restarts itself with the allocator and the rest of the rank
# environment (fsdp2_restart_with_rank_environment), so nothing is left for
# setup_environment() to warn about.
port=$(( 20000 + RANDOM % 20000 ))
outside=$(env -u LD_PRELOAD -u OMP_WAIT_POLICY -u FSDP2_ALLOCATOR \
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 \
  MASTER_PORT=$port timeout 300 "$train" --steps 1 2>&1) || {
  echo "FAIL: a torchrun-style rank exited non-zero"; echo "$outside"; exit 1; }
grep -q "rank 0 of 1, allocator tcmalloc" <<<"$outside" && ! grep -q "warning" <<<"$outside" || {
  echo "FAIL: a torchrun-style rank did not restart with the rank environment:"
  echo "$outside"; exit 1; }
if timeout 60 "$train" --nproc 2 --bogus 1 >/dev/null 2>&1; then echo "FAIL: an unknown flag was accepted"; exit 1; fi
if timeout 60 "$train" --nproc 1 --steps 1 --data /nonexistent >"$tmp/err" 2>&1; then
  echo "FAIL: a missing data file was accepted"; exit 1; fi
grep -q "cannot open token file /nonexistent" "$tmp/err" || { echo "FAIL: unclear error:"; cat "$tmp/err"; exit 1; }
echo PASS
