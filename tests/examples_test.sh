#!/usr/bin/env bash
# The main job: trains on 1 and 2 local ranks with the same global batch and
# must print the same losses; bad input must give one line and a non-zero
# exit, never a hang.
set -uo pipefail
train="$1"
tmp="${TEST_TMPDIR:-/tmp}"
fail=0

run() { timeout 300 "$train" "$@" 2>&1; }
losses() { grep -o ' loss [0-9][0-9.]*' | awk '{print $2}'; }

common=(--steps 4 --n-layer 2 --n-embd 32 --n-head 2 --block-size 32 --threads 1)
one=$(run --nproc 1 --batch-size 8 "${common[@]}" --metrics-out "$tmp/m1.jsonl" --out-dir "$tmp/out1") || { echo "nproc 1 failed"; echo "$one"; exit 1; }
two=$(run --nproc 2 --batch-size 4 "${common[@]}" --metrics-out "$tmp/m2.jsonl" --out-dir "$tmp/out2") || { echo "nproc 2 failed"; echo "$two"; exit 1; }
echo "$two"
l1=$(echo "$one" | losses); l2=$(echo "$two" | losses)
if [[ -z "$l1" || "$l1" != "$l2" ]]; then
  echo "FAIL: losses differ between --nproc 1 and --nproc 2:"; paste <(echo "$l1") <(echo "$l2"); fail=1
fi
if [[ $(wc -l < "$tmp/m2.jsonl") -ne 4 ]] || ! grep -q '"tokens_per_s"' "$tmp/m2.jsonl" \
   || ! grep -q '"peak_rss_bytes": \[[0-9]*, [0-9]*\]' "$tmp/m2.jsonl"; then
  echo "FAIL: metrics file lacks one JSON line per step with tokens_per_s and per-rank peak memory"
  cat "$tmp/m2.jsonl"; fail=1
fi

if [[ $(wc -l < "$tmp/out2/metrics.csv") -ne 5 ]] || ! grep -q '<polyline' "$tmp/out2/loss.svg"; then
  echo "FAIL: expected metrics.csv (header + 4 steps) and a loss curve in --out-dir"; fail=1
fi

# Tensor parallelism: 2 ranks splitting every block (dp = 1, tp = 2) on the
# same global batch print the same losses as one process.
tp=$(run --nproc 2 --tensor-parallel 2 --batch-size 8 "${common[@]}" --out-dir "$tmp/otp") || { echo "tensor-parallel run failed"; echo "$tp"; exit 1; }
ltp=$(echo "$tp" | losses)
if [[ "$ltp" != "$l1" ]] || ! grep -q 'DeviceMesh(dp=1, tp=2)' <<<"$tp"; then
  echo "FAIL: --nproc 2 --tensor-parallel 2 differs from --nproc 1:"; paste <(echo "$l1") <(echo "$ltp"); fail=1
fi

# HYBRID_SHARD on one host: by default the host's 4 ranks are one shard
# group (each holds a quarter); --shard-group-size 2 makes two replicas of
# 2. Both equal one process.
for g in 0 2; do
  hy=$(run --nproc 4 --batch-size 2 "${common[@]}" --strategy hybrid_shard --shard-group-size $g --out-dir "$tmp/ohy$g") || { echo "hybrid_shard run failed"; echo "$hy"; exit 1; }
  want=$([[ $g == 0 ]] && echo "replicate=1, shard=4" || echo "replicate=2, shard=2")
  if [[ "$(echo "$hy" | losses)" != "$l1" ]] || ! grep -q "DeviceMesh($want)" <<<"$hy"; then
    echo "FAIL: --strategy hybrid_shard --shard-group-size $g on 4 ranks: want DeviceMesh($want) and the losses of --nproc 1:"
    echo "$hy"; fail=1
  fi
done

# Resume: 2 ranks train 2 steps and save; 1 rank resumes to step 4; the
# losses of steps 3 and 4 equal the uninterrupted run's.
first=$(run --nproc 2 --batch-size 4 "${common[@]}" --steps 2 --ckpt-dir "$tmp/ckpt" --out-dir "$tmp/o3") || { echo "$first"; exit 1; }
resumed=$(run --nproc 1 --batch-size 8 "${common[@]}" --resume "$tmp/ckpt" --out-dir "$tmp/o4") || { echo "$resumed"; exit 1; }
echo "$resumed"
lr=$( (echo "$first"; echo "$resumed") | grep -v checkpoint | losses)
if [[ "$lr" != "$l2" ]]; then
  echo "FAIL: 2 steps on 2 ranks + resume on 1 rank differ from 4 uninterrupted steps:"
  paste <(echo "$l2") <(echo "$lr"); fail=1
fi

# The same with a full (single-file) checkpoint, resumed on 2 ranks.
first=$(run --nproc 1 --batch-size 8 "${common[@]}" --steps 2 --ckpt-dir "$tmp/full.safetensors" --checkpoint-format full --out-dir "$tmp/o5") || { echo "$first"; exit 1; }
resumed=$(run --nproc 2 --batch-size 4 "${common[@]}" --resume "$tmp/full.safetensors" --out-dir "$tmp/o6") || { echo "$resumed"; exit 1; }
lf=$( (echo "$first"; echo "$resumed") | grep -v checkpoint | losses)
if [[ "$lf" != "$l2" ]]; then
  echo "FAIL: full checkpoint resume differs:"; paste <(echo "$l2") <(echo "$lf"); fail=1
fi

# Rotation: a checkpoint every step, the newest 2 kept.
out=$(run --nproc 2 --batch-size 4 "${common[@]}" --ckpt-dir "$tmp/rot" --ckpt-every 1 --ckpt-keep 2 --out-dir "$tmp/o7") || { echo "$out"; exit 1; }
if [[ "$(ls "$tmp/rot" | tr '\n' ' ')" != "step-3 step-4 " ]]; then
  echo "FAIL: --ckpt-keep 2 should leave step-3 and step-4, found: $(ls "$tmp/rot")"; fail=1
fi

# The allocator (core/launch/allocator.h): every rank the launcher starts
# runs with tcmalloc, and so does a rank an outside launcher started
# (torchrun-style variables, no LD_PRELOAD): it restarts itself with it.
for r in 0 1; do
  if ! grep -q "\[rank $r\] rank $r: .*allocator tcmalloc" <<<"$two"; then
    echo "FAIL: rank $r of the launched job does not run with tcmalloc"; fail=1
  fi
done
port=$(( 20000 + RANDOM % 20000 ))
outside=$(env -u LD_PRELOAD RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 300 "$train" --steps 1 "${common[@]}" \
  --out-dir "$tmp/o8" 2>&1) || { echo "torchrun-style rank failed"; echo "$outside"; exit 1; }
if ! grep -q "rank 0: .*allocator tcmalloc" <<<"$outside"; then
  echo "FAIL: a rank started by an outside launcher does not restart with tcmalloc:"
  echo "$outside"; fail=1
fi
off=$(FSDP2_ALLOCATOR=system run --nproc 2 --batch-size 4 "${common[@]}" --steps 1 --out-dir "$tmp/o9") || { echo "$off"; exit 1; }
if [[ $(grep -c "allocator system" <<<"$off") -ne 2 ]]; then
  echo "FAIL: FSDP2_ALLOCATOR=system should leave both ranks on the system allocator:"
  echo "$off"; fail=1
fi

# Activation checkpointing: every block, then every 2nd, recomputed in
# backward; the same losses as keeping the activations.
ac=$(run --nproc 2 --batch-size 4 "${common[@]}" --activation-checkpointing 1 --out-dir "$tmp/oac") || { echo "$ac"; exit 1; }
acs=$(run --nproc 2 --batch-size 4 "${common[@]}" --activation-checkpointing 1 --ac-every 2 --out-dir "$tmp/oacs") || { echo "$acs"; exit 1; }
if [[ "$(echo "$ac" | losses)" != "$l2" || "$(echo "$acs" | losses)" != "$l2" ]] \
   || ! grep -q "full, 2 of 2 blocks recomputed" <<<"$ac" \
   || ! grep -q "selective(every 2), 1 of 2 blocks recomputed" <<<"$acs"; then
  echo "FAIL: --activation-checkpointing 1 (--ac-every 2) should recompute 2 (1) of 2 blocks with the same losses:"
  echo "$ac"; echo "$acs"; fail=1
fi

expect_error() {  # expected-text args...
  local want="$1"; shift
  out=$(run "$@"); code=$?
  if [[ $code -eq 0 || $code -eq 124 ]] || ! grep -q -- "$want" <<<"$out" || [[ $(wc -l <<<"$out") -ne 1 ]]; then
    echo "FAIL: '$*' should fail with one line containing '$want' (exit $code):"; echo "$out"; fail=1
  fi
}
expect_error "--nproc must be at least 1" --nproc 0
expect_error "unknown flag --bogus" --bogus 1
expect_error "no such file" --data /nonexistent/corpus.txt
expect_error "is a directory" --data "$tmp"
expect_error "unknown sharding strategy" --strategy zero3
expect_error "--shard-group-size must divide the 3 data-parallel ranks" --nproc 3 --strategy hybrid_shard --shard-group-size 2
expect_error "no such checkpoint" --resume "$tmp/no_such_ckpt"
expect_error "must be sharded or full" --checkpoint-format zip
expect_error "--tensor-parallel must divide --nproc" --nproc 2 --tensor-parallel 3
expect_error "need --tensor-parallel 1" --nproc 2 --tensor-parallel 2 --ckpt-dir "$tmp/tpckpt"
expect_error "--activation-checkpointing must be 0 or 1" --activation-checkpointing 2
expect_error "--ac-every needs --activation-checkpointing 1" --ac-every 2
expect_error "--ac-every must be at least 1" --activation-checkpointing 1 --ac-every 0

if [[ $fail -ne 0 ]]; then exit 1; fi
echo "examples_test: all checks passed"
