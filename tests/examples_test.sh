#!/usr/bin/env bash
# The main job: trains on 1 and 2 local ranks with the same global batch and
# must print the same losses; bad input must give one line and a non-zero
# exit, never a hang.
set -uo pipefail
train="$1"
hf_reference="$2"  # tests/hf/hf_reference.py, run with $FSDP2_PYTHON (transformers)
tmp="${TEST_TMPDIR:-/tmp}"
fail=0
# As on users' machines, which set neither.
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE

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
# losses of steps 3 and 4 equal the uninterrupted run's. The target is an
# existing empty directory: it takes a checkpoint in both formats.
mkdir -p "$tmp/ckpt" "$tmp/full"
first=$(run --nproc 2 --batch-size 4 "${common[@]}" --steps 2 --ckpt-dir "$tmp/ckpt" --out-dir "$tmp/o3") || { echo "$first"; exit 1; }
resumed=$(run --nproc 1 --batch-size 8 "${common[@]}" --resume "$tmp/ckpt" --out-dir "$tmp/o4") || { echo "$resumed"; exit 1; }
echo "$resumed"
lr=$( (echo "$first"; echo "$resumed") | grep -v checkpoint | losses)
if [[ "$lr" != "$l2" ]]; then
  echo "FAIL: 2 steps on 2 ranks + resume on 1 rank differ from 4 uninterrupted steps:"
  paste <(echo "$l2") <(echo "$lr"); fail=1
fi

# A background save (--ckpt-async 1) writes the same files as a synchronous one.
out=$(run --nproc 2 --batch-size 4 "${common[@]}" --steps 2 --ckpt-dir "$tmp/async" --ckpt-async 1 --out-dir "$tmp/o3b") || { echo "$out"; exit 1; }
for f in "$tmp"/ckpt/*; do
  cmp -s "$f" "$tmp/async/$(basename "$f")" || { echo "FAIL: --ckpt-async wrote another $(basename "$f")"; fail=1; }
done
if [[ "$(ls "$tmp/async")" != "$(ls "$tmp/ckpt")" ]] || ! grep -q "written in the background" <<<"$out"; then
  echo "FAIL: --ckpt-async: $(ls "$tmp/async") vs $(ls "$tmp/ckpt")"; echo "$out"; fail=1
fi

# The same with a full checkpoint (a directory holding one safetensors
# file, checkpoint.safetensors), resumed on 2 ranks.
first=$(run --nproc 1 --batch-size 8 "${common[@]}" --steps 2 --ckpt-dir "$tmp/full" --checkpoint-format full --out-dir "$tmp/o5") || { echo "$first"; exit 1; }
if [[ "$(ls "$tmp/full")" != "checkpoint.safetensors" ]]; then
  echo "FAIL: a full checkpoint should be DIR/checkpoint.safetensors, found: $(ls "$tmp/full")"; fail=1
fi
resumed=$(run --nproc 2 --batch-size 4 "${common[@]}" --resume "$tmp/full" --out-dir "$tmp/o6") || { echo "$resumed"; exit 1; }
lf=$( (echo "$first"; echo "$resumed") | grep -v checkpoint | losses)
if [[ "$lf" != "$l2" ]]; then
  echo "FAIL: full checkpoint resume differs:"; paste <(echo "$l2") <(echo "$lf"); fail=1
fi
# Tensor-parallel checkpoints: (dp, tp) = (1, 2) saves after 2 steps, one
# process resumes (sharded), and (dp, tp) = (1, 2) resumes a full checkpoint
# of one process: the losses are the uninterrupted run's.
first=$(run --nproc 2 --tensor-parallel 2 --batch-size 8 "${common[@]}" --steps 2 --ckpt-dir "$tmp/tpckpt" --out-dir "$tmp/otp1") || { echo "$first"; exit 1; }
resumed=$(run --nproc 1 --batch-size 8 "${common[@]}" --resume "$tmp/tpckpt" --out-dir "$tmp/otp2") || { echo "$resumed"; exit 1; }
ltc=$( (echo "$first"; echo "$resumed") | grep -v checkpoint | losses)
resumed=$(run --nproc 2 --tensor-parallel 2 --batch-size 8 "${common[@]}" --resume "$tmp/full" --out-dir "$tmp/otp3") || { echo "$resumed"; exit 1; }
ltf=$( (echo "$first"; echo "$resumed") | grep -v checkpoint | losses)
if [[ "$ltc" != "$l1" || "$ltf" != "$l1" ]]; then
  echo "FAIL: tensor-parallel checkpoints resume with other losses:"; paste <(echo "$l1") <(echo "$ltc") <(echo "$ltf"); fail=1
fi
# A single-file full checkpoint of an earlier fsdp2 still loads.
cp "$tmp/full/checkpoint.safetensors" "$tmp/old.safetensors"
resumed=$(run --nproc 2 --batch-size 4 "${common[@]}" --resume "$tmp/old.safetensors" --out-dir "$tmp/o6b") || { echo "$resumed"; exit 1; }
lo=$( (echo "$first"; echo "$resumed") | grep -v checkpoint | losses)
if [[ "$lo" != "$l2" ]]; then
  echo "FAIL: resuming from a single-file full checkpoint differs:"; paste <(echo "$l2") <(echo "$lo"); fail=1
fi
# A full save replaces a sharded checkpoint in the same directory.
out=$(run --nproc 1 --batch-size 8 "${common[@]}" --steps 1 --ckpt-dir "$tmp/ckpt" --checkpoint-format full --out-dir "$tmp/o6c") || { echo "$out"; exit 1; }
if [[ "$(ls "$tmp/ckpt")" != "checkpoint.safetensors" ]]; then
  echo "FAIL: a full save should replace the sharded checkpoint in $tmp/ckpt, found: $(ls "$tmp/ckpt")"; fail=1
fi

# Rotation: a checkpoint every step, the newest 2 kept.
out=$(run --nproc 2 --batch-size 4 "${common[@]}" --ckpt-dir "$tmp/rot" --ckpt-every 1 --ckpt-keep 2 --out-dir "$tmp/o7") || { echo "$out"; exit 1; }
if [[ "$(ls "$tmp/rot" | tr '\n' ' ')" != "step-3 step-4 " ]]; then
  echo "FAIL: --ckpt-keep 2 should leave step-3 and step-4, found: $(ls "$tmp/rot")"; fail=1
fi

# Restart after a failure: rank 1 dies (SIGKILL) after step 3, with a
# checkpoint every 2 steps; with --max-restarts 1 the launcher restarts both
# ranks, they resume from step 2 and end with the uninterrupted losses.
# Without it the job fails. Then rank 0 dies after step 3 of a run saving
# full checkpoints in the background every step into step-N directories.
restart_losses() { sed -n '/^\[rank 0\] resumed from/,$p' | losses; }
want=$(echo "$l2" | tail -n 2)
out=$(FSDP2_FAULT_AT_STEP=1:3 run --nproc 2 --batch-size 4 "${common[@]}" --ckpt-dir "$tmp/restart" --ckpt-every 2 --max-restarts 1 --out-dir "$tmp/o10") || { echo "$out"; fail=1; }
if [[ "$(restart_losses <<<"$out")" != "$want" ]] || ! grep -q "restarting all 2 ranks" <<<"$out" \
   || ! grep -q "resumed from $tmp/restart at step 2" <<<"$out"; then
  echo "FAIL: a run restarted after rank 1 died should resume at step 2 with the uninterrupted losses:"
  echo "$out"; paste <(echo "$want") <(restart_losses <<<"$out"); fail=1
fi
if FSDP2_FAULT_AT_STEP=1:3 run --nproc 2 --batch-size 4 "${common[@]}" --ckpt-dir "$tmp/restart0" --ckpt-every 2 --out-dir "$tmp/o11" > /dev/null; then
  echo "FAIL: without --max-restarts a dead rank should fail the job"; fail=1
fi
out=$(FSDP2_FAULT_AT_STEP=0:3 run --nproc 2 --batch-size 4 "${common[@]}" --ckpt-dir "$tmp/restart2" --ckpt-every 1 --ckpt-keep 2 --ckpt-async 1 --checkpoint-format full --max-restarts 2 --out-dir "$tmp/o12") || { echo "$out"; fail=1; }
got=$(restart_losses <<<"$out")
if [[ -z "$got" || "$got" != "$(echo "$l2" | tail -n "$(wc -l <<<"$got")")" ]] \
   || ! grep -q "resumed from $tmp/restart2/step-[23] at step [23]" <<<"$out"; then
  echo "FAIL: a run restarted after rank 0 died during background saves differs:"; echo "$out"; fail=1
fi
# --ckpt-keep 2 counts the checkpoints of the run before the restart too.
if [[ "$(ls "$tmp/restart2" | tr '\n' ' ')" != "step-3 step-4 " ]]; then
  echo "FAIL: after the restart --ckpt-keep 2 should leave step-3 and step-4, found: $(ls "$tmp/restart2")"; fail=1
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
outside=$(env -u LD_PRELOAD -u OMP_WAIT_POLICY -u OMP_NUM_THREADS \
  -u FSDP2_THREADS RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 300 "$train" "${common[@]}" --steps 1 \
  --threads 0 --out-dir "$tmp/o8" 2>&1) || { echo "torchrun-style rank failed"; echo "$outside"; exit 1; }
# Alone on its host with no thread count given, it takes every core.
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # the CPUs this test may use
if ! grep -q "threads per rank: $cores; device: cpu\$" <<<"$outside"; then
  echo "FAIL: a rank alone on its host should use all $cores cores:"; echo "$outside"; fail=1
fi
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
expect_error "unknown checkpoint format" --checkpoint-format zip
expect_error "--tensor-parallel must divide --nproc" --nproc 2 --tensor-parallel 3
# A target that cannot take a checkpoint is refused before any training, in
# both formats (one line, no loss printed).
echo "not a checkpoint" > "$tmp/a_file"
mkdir -p "$tmp/foreign" && echo "notes" > "$tmp/foreign/notes.txt"
for format in sharded full; do
  expect_error "exists and is a file" --checkpoint-format $format --ckpt-dir "$tmp/a_file"
  expect_error "is a file, not a directory" --checkpoint-format $format --ckpt-dir "$tmp/a_file/ckpt"
  expect_error "holds 'notes.txt', which is not part of an fsdp2 checkpoint" --checkpoint-format $format --ckpt-dir "$tmp/foreign"
  expect_error "cannot be written" --checkpoint-format $format --ckpt-dir /proc/fsdp2_ckpt
done
if [[ "$(cat "$tmp/foreign/notes.txt")" != "notes" ]]; then echo "FAIL: a foreign directory was touched"; fail=1; fi
expect_error "--activation-checkpointing must be 0 or 1" --activation-checkpointing 2
expect_error "--ac-every needs --activation-checkpointing 1" --ac-every 2
expect_error "--ac-every must be at least 1" --activation-checkpointing 1 --ac-every 0

expect_error "has no config.json" --hf-model "$tmp"
expect_error "--save-hf needs --hf-model" --save-hf "$tmp/hf_nowhere"
expect_error "--data-tokens must be uint8, uint16 or int32" --data-tokens int64
expect_error "--save-hf-shard-size: max_shard_size \"lots\"" --save-hf-shard-size lots

# A Hugging Face checkpoint made by transformers (--hf-model, Qwen2 with
# tied embeddings) trains alike on 1 and 2 ranks with a layer frozen, and
# --save-hf writes it back in bfloat16 in transformers' layout.
if "$FSDP2_PYTHON" "$hf_reference" prepare "$tmp/hf" >"$tmp/hf_prepare.log" 2>&1; then
  hf=(--hf-model "$tmp/hf/qwen2" --data synthetic --steps 3 --block-size 16 --threads 1
      --frozen-params "model.layers.0.*" --val-every 0)
  h1=$(run --nproc 1 --batch-size 4 "${hf[@]}" --out-dir "$tmp/hf1") || { echo "FAIL: --hf-model on 1 rank"; echo "$h1"; fail=1; }
  h2=$(run --nproc 2 --batch-size 2 "${hf[@]}" --out-dir "$tmp/hf2" --save-hf "$tmp/hf_saved" \
       --save-hf-dtype bfloat16) || { echo "FAIL: --hf-model on 2 ranks"; echo "$h2"; fail=1; }
  echo "$h2"
  k1=$(echo "$h1" | losses); k2=$(echo "$h2" | losses)
  if [[ $(echo "$k1" | wc -l) -ne 3 || "$k1" != "$k2" ]]; then
    echo "FAIL: --hf-model losses differ between 1 and 2 ranks:"; paste <(echo "$k1") <(echo "$k2"); fail=1
  fi
  grep -q "model: .*qwen2 (qwen2, 3 layers, vocabulary 96); frozen: model.layers.0" <<<"$h2" || {
    echo "FAIL: no model line for --hf-model"; fail=1; }
  if [[ ! -f "$tmp/hf_saved/model.safetensors" ]] || ! grep -q '"dtype": "bfloat16"' "$tmp/hf_saved/config.json"; then
    echo "FAIL: --save-hf did not write a bfloat16 model.safetensors and config.json"; fail=1
  fi
  # The tensors themselves, whose dtype config.json does not decide: the
  # safetensors header (an 8-byte little-endian length, then JSON) must
  # give every tensor of the model as BF16, 2 bytes an element.
  dtypes=$("$FSDP2_PYTHON" - "$tmp/hf_saved/model.safetensors" "$tmp/hf/qwen2/model.safetensors" <<'PY' 2>&1
import json, math, struct, sys
def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h
saved, original = header(sys.argv[1]), header(sys.argv[2])
if sorted(saved) != sorted(original):
    print("wrong: not the model's tensors:", sorted(saved), sorted(original))
for name, t in sorted(saved.items()):
    begin, end = t["data_offsets"]
    ok = t["dtype"] == "BF16" and end - begin == 2 * math.prod(t["shape"])
    print(("" if ok else "wrong: ") + name + " " + t["dtype"] + " " + str(t["shape"]))
PY
  )
  if [[ $? -ne 0 ]] || ! grep -q "^model.embed_tokens.weight BF16" <<<"$dtypes" \
     || grep -q "^wrong" <<<"$dtypes"; then
    echo "FAIL: --save-hf-dtype bfloat16 should store every tensor as BF16:"; echo "$dtypes"; fail=1
  fi
else
  echo "FAIL: hf_reference.py prepare"; cat "$tmp/hf_prepare.log"; fail=1
fi

if [[ $fail -ne 0 ]]; then exit 1; fi
echo "examples_test: all checks passed"
