#!/usr/bin/env bash
# The GPU check: fsdp2 on one NVIDIA GPU against PyTorch's eager training and
# PyTorch's own FSDP2, from binaries built on a CPU machine.
#
#   bench/gpu_check/gpu_check.sh pack           # here: build -c opt, strip, bundle
#   bench/gpu_check/gpu_check.sh run            # on the GPU machine, from the tree
#   bench/gpu_check/gpu_check.sh run --dry-run  # here: the same steps on the CPU, tiny sizes
#
# pack builds //examples:train, //tests:gpu_test, //tests:nccl_transport_test,
# //core/kernels:kernels_gpu_test and //bench:kernels with -c opt (the CUDA
# kernels by nvcc), strips them and copies them with the shared libraries they need
# that are neither LibTorch's, NVIDIA's nor the system's (Bazel's own
# libraries of our code) into gpu_bundle/ (under 64 MiB; git ignores it, so
# a device run carries it).
#
# run prints one table (and writes it, with the full log, to $OUT, default
# /tmp/gpu_check):
#   - the GPU, its driver, CUDA and torch versions;
#   - the GPU tests (gpu_test, nccl_transport_test, kernels_gpu_test: each
#     CUDA kernel against its ATen composite): passed, failed or skipped;
#   - fp32: the losses of the first 10 steps of fsdp2's main job and of eager
#     PyTorch from the same initial weights on the same batches, and their
#     largest relative difference (target: 1e-4);
#   - bf16, N = 1, GPT-2 small (12 x 768, 12 heads, vocabulary 50304, T 1024):
#     tokens/s, MFU (6 x parameters x tokens/s over the card's dense bf16
#     peak, 989 TFLOP/s for an H100 or H200 SXM) and peak GPU memory of
#     fsdp2, eager PyTorch under autocast and PyTorch's FSDP2 (fully_shard,
#     AdamW fused and foreach;
#     MixedPrecisionPolicy bf16/fp32, fp32 logits), and fsdp2's ratios to them;
#     fsdp2 with activation checkpointing too, and with the ATen
#     composites in place of core/kernels' CUDA kernels
#     (FSDP2_CUDA_KERNELS=off); eager PyTorch with
#     torch.compile; and at 32 x 1024 tokens fsdp2, eager PyTorch and
#     PyTorch with torch.compile (issue #48's targets: 1.0x compiled PyTorch,
#     1.1x eager, 40% MFU at 32 x 1024);
#   - CPU offload, bf16, N = 1, GPT-2 medium (24 x 1024, 16 heads), 8 x 1024
#     tokens: fsdp2 with and without --cpu-offload (with the main job's
#     clipping and without it) and PyTorch's FSDP2 with and without
#     CPUOffloadPolicy(pin_memory=True), tokens/s and peak GPU memory, and
#     GPT-2 XL (48 x 1600, 25 heads) under --gpu-memory-limit 16: 10 steps
#     with --cpu-offload, the out-of-memory error without it.
#   - the kernels one by one against their composites (bench/kernels), and a
#     Chrome/Perfetto trace of two fsdp2 steps (--profile 2, gzipped, in $OUT
#     only);
#   - a verdict: every test PASSED, the fp32 target met and every run
#     measured, or what was not.
# Its exit status is the verdict's, dry run included: 0 only if everything
# passed; 1 for a FAILED or SKIPPED test, a target NOT met or a run that
# failed; 2 when it cannot start. The GPU tests run with FSDP2_REQUIRE_GPU=1
# (no visible GPU fails them); in a dry run with FSDP2_GPU_TEST_DRY_RUN=1
# (their cases on the CPU; nccl_transport_test's GPU cases cannot run there
# and are counted as such).
# The loader finds LibTorch and NCCL in the Python environment that has torch
# (FSDP2_GPU_PYTHON, default /opt/torch/.venv/bin/python3, or the project's
# venv in a dry run).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUNDLE="$ROOT/gpu_bundle"
HERE="$ROOT/bench/gpu_check"

pack() {
  set -e
  cd "$ROOT"
  local targets=(//examples:train //tests:gpu_test //tests:nccl_transport_test
                 //core/kernels:kernels_gpu_test //bench:kernels)
  # -c opt unless FSDP2_PACK_MODE says otherwise (fastbuild: the objects a
  # test run has built already, when there is no time for another build;
  # LibTorch and the CUDA kernels are optimised either way).
  local mode="${FSDP2_PACK_MODE:-opt}"
  bazel build -c "$mode" ${FSDP2_BAZEL_FLAGS:-} "${targets[@]}"
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
  local bin
  bin="$(bazel info -c "$mode" ${FSDP2_BAZEL_FLAGS:-} bazel-bin 2>/dev/null)"
  for t in examples/train tests/gpu_test tests/nccl_transport_test core/kernels/kernels_gpu_test \
           bench/kernels; do
    cp "$bin/$t" "$BUNDLE/bin/"
    chmod u+w "$BUNDLE/bin/$(basename "$t")"
    strip --strip-unneeded "$BUNDLE/bin/$(basename "$t")"
    # Libraries of our own (Bazel's _solib_ directories): everything the
    # loader finds outside the system, LibTorch and NVIDIA's wheels.
    ldd "$bin/$t" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
      case "$lib" in
        /lib/* | /usr/lib/* | /lib64/* | */site-packages/torch/lib/* | */site-packages/nvidia/* | */site-packages/torch/../nvidia/*) ;;
        *) cp -L "$lib" "$BUNDLE/lib/" && chmod u+w "$BUNDLE/lib/$(basename "$lib")" &&
             strip --strip-unneeded "$BUNDLE/lib/$(basename "$lib")" ;;
      esac
    done
  done
  echo "$mode" >"$BUNDLE/mode"
  echo "gpu_bundle ($mode): $(du -sh "$BUNDLE" | cut -f1) ($(ls "$BUNDLE/bin" | tr '\n' ' ')+ $(ls "$BUNDLE/lib" | wc -l) libraries)"
}

run() {
  local dry=0
  [[ "${1:-}" == "--dry-run" ]] && dry=1
  local out="${OUT:-/tmp/gpu_check}"
  mkdir -p "$out"
  local log="$out/gpu_check.log"
  : >"$log"
  # Nothing of an earlier run may stand in for a step of this one.
  rm -rf "$out/fsdp2_fp32" "$out/fsdp2_bf16" "$out/fsdp2_bf16_ac" "$out/fsdp2_bf16_aten" "$out"/offload_* "$out"/xl_* \
    "$out"/torch_offload*.json "$out/init_medium.safetensors" "$out"/fsdp2_bf16_b* "$out"/*_fused_b*.json \
    "$out/fsdp2_profile" "$out"/trace*.json* "$out/kernels.txt"
  rm -f "$out"/{versions.txt,tests.txt,table.md,init.safetensors,eager_fp32.json} \
    "$out"/*_bf16.json "$out"/*_test.log "$out"/fsdp2_*.log
  local py="${FSDP2_GPU_PYTHON:-/opt/torch/.venv/bin/python3}"
  [[ $dry == 1 ]] && py="${FSDP2_GPU_PYTHON:-/opt/fsdp2/venv/bin/python3}"
  [[ -x "$py" ]] || { echo "gpu_check: no Python with torch at $py (FSDP2_GPU_PYTHON)"; return 2; }
  [[ -x "$BUNDLE/bin/train" ]] || { echo "gpu_check: no $BUNDLE/bin/train: run '$0 pack' first"; return 2; }
  local site
  site="$("$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')"
  local libs="$BUNDLE/lib:$site/torch/lib"
  for d in "$site"/nvidia/*/lib; do [[ -d "$d" ]] && libs="$libs:$d"; done
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export FSDP2_ALLOCATOR=system OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
  unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE

  # Sizes: GPT-2 small on the GPU; a tiny GPT on the CPU in a dry run.
  local device=cuda sizes=(--n-layer 12 --n-embd 768 --n-head 12 --block-size 1024 --vocab-size 50304)
  local batch=8 warmup=5 steps=20 loss_steps=10 big_batch=32
  if [[ $dry == 1 ]]; then
    device=cpu
    sizes=(--n-layer 2 --n-embd 64 --n-head 2 --block-size 32 --vocab-size 256)
    batch=4 warmup=1 steps=3 loss_steps=4 big_batch=8
  fi
  local ref="$HERE/torch_reference.py"
  local train=(timeout 300 "$BUNDLE/bin/train" --nproc 1 --device "$device" --data synthetic
               "${sizes[@]}" --batch-size "$batch" --lr 3e-4 --val-every 1000000
               --progress-bar 0 --seed 1337 --init-from "$out/init.safetensors")
  step() { echo "== $*" >>"$log"; echo "== $*"; }

  step versions
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
      echo "no nvidia-smi"
    "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-",
"gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")'
    echo "fsdp2 binaries: -c $(cat "$BUNDLE/mode" 2>/dev/null || echo opt)"
  } >"$out/versions.txt" 2>&1
  cat "$out/versions.txt" >>"$log"

  step tests
  : >"$out/tests.txt"
  local t mode=(FSDP2_REQUIRE_GPU=1)
  [[ $dry == 1 ]] && mode=(FSDP2_GPU_TEST_DRY_RUN=1)
  for t in nccl_transport_test gpu_test kernels_gpu_test; do
    env -u FSDP2_REQUIRE_GPU -u FSDP2_GPU_TEST_DRY_RUN "${mode[@]}" \
      timeout 240 "$BUNDLE/bin/$t" >"$out/$t.log" 2>&1
    local rc=$?
    test_result "$t" "$rc" "$out/$t.log" "$dry" >>"$out/tests.txt"
    cat "$out/$t.log" >>"$log"
  done

  step init
  "$py" "$ref" init "${sizes[@]}" --seed 1337 --out "$out/init.safetensors" >>"$log" 2>&1 ||
    echo "init failed" >>"$log"

  step "fp32 losses"
  FSDP2_BACKEND=nccl "${train[@]}" --mixed-precision fp32 --steps "$loss_steps" \
    --out-dir "$out/fsdp2_fp32" >"$out/fsdp2_fp32.log" 2>&1
  cat "$out/fsdp2_fp32.log" >>"$log"
  "$py" "$ref" train --mode eager --precision fp32 "${sizes[@]}" --seed 1337 --device "$device" \
    --init "$out/init.safetensors" --batch-size "$batch" --steps "$loss_steps" --warmup 0 \
    --json "$out/eager_fp32.json" >>"$log" 2>&1

  step "bf16 speed"
  FSDP2_BACKEND=nccl "${train[@]}" --mixed-precision bf16 --steps $((warmup + steps)) \
    --out-dir "$out/fsdp2_bf16" >"$out/fsdp2_bf16.log" 2>&1
  cat "$out/fsdp2_bf16.log" >>"$log"
  FSDP2_BACKEND=nccl "${train[@]}" --mixed-precision bf16 --steps $((warmup + steps)) \
    --activation-checkpointing 1 --out-dir "$out/fsdp2_bf16_ac" >"$out/fsdp2_bf16_ac.log" 2>&1
  cat "$out/fsdp2_bf16_ac.log" >>"$log"
  # The same without core/kernels' CUDA kernels (their ATen composites):
  # what the kernels buy.
  FSDP2_CUDA_KERNELS=off FSDP2_BACKEND=nccl "${train[@]}" --mixed-precision bf16 \
    --steps $((warmup + steps)) --out-dir "$out/fsdp2_bf16_aten" >"$out/fsdp2_bf16_aten.log" 2>&1
  cat "$out/fsdp2_bf16_aten.log" >>"$log"
  # PyTorch with AdamW fused (fsdp2's choice on a GPU) and, for FSDP2 (whose
  # parameters are DTensors), foreach too: PyTorch at its best.
  for run in eager:fused fsdp2:fused fsdp2:foreach; do
    "$py" "$ref" train --mode "${run%%:*}" --adamw "${run##*:}" --precision bf16 "${sizes[@]}" \
      --seed 1337 --device "$device" --init "$out/init.safetensors" --batch-size "$batch" \
      --steps "$steps" --warmup "$warmup" --json "$out/${run%%:*}_${run##*:}_bf16.json" >>"$log" 2>&1
  done
  # torch.compile (issue #48): eager PyTorch plus the one line, its first
  # steps compiling (two more warm-up steps for that).
  "$py" "$ref" train --mode eager --compile --precision bf16 "${sizes[@]}" --seed 1337 \
    --device "$device" --init "$out/init.safetensors" --batch-size "$batch" --steps "$steps" \
    --warmup $((warmup + 2)) --json "$out/compile_fused_bf16.json" >>"$log" 2>&1

  # 32 x 1024 tokens a step (the dry run: 8 rows): fsdp2, eager PyTorch and
  # torch.compile, where the step is long enough for MFU to mean something.
  step "bf16 speed, $big_batch rows"
  local big=(--steps $((warmup + steps / 2)))
  FSDP2_BACKEND=nccl "${train[@]}" --mixed-precision bf16 --batch-size "$big_batch" "${big[@]}" \
    --out-dir "$out/fsdp2_bf16_b$big_batch" >"$out/fsdp2_bf16_b$big_batch.log" 2>&1
  cat "$out/fsdp2_bf16_b$big_batch.log" >>"$log"
  local name
  for name in eager compile; do
    "$py" "$ref" train --mode eager $([[ $name == compile ]] && echo --compile) --precision bf16 \
      "${sizes[@]}" --seed 1337 --device "$device" --init "$out/init.safetensors" \
      --batch-size "$big_batch" --steps $((steps / 2)) --warmup $((warmup + 2)) \
      --json "$out/${name}_fused_b$big_batch.json" >>"$log" 2>&1
  done

  # CPU offload (issue #45): GPT-2 medium, with and without offload, fsdp2
  # and PyTorch's FSDP2 (CPUOffloadPolicy), every host thread for the host
  # optimizers; fsdp2 with the shipped clipping (1.0) and without it (the
  # steps then overlap the backward). Then GPT-2 XL under a 16 GiB cap: with
  # offload it trains, without it ends with the out-of-memory error.
  step "cpu offload"
  local medium=(--n-layer 24 --n-embd 1024 --n-head 16 --block-size 1024 --vocab-size 50304)
  local xl=(--n-layer 48 --n-embd 1600 --n-head 25 --block-size 1024 --vocab-size 50304)
  local off_batch=8 off_warmup=3 off_steps=10 xl_batch=4 xl_steps=10 cap=16
  if [[ $dry == 1 ]]; then
    medium=(--n-layer 2 --n-embd 64 --n-head 2 --block-size 32 --vocab-size 256)
    xl=(--n-layer 3 --n-embd 64 --n-head 2 --block-size 32 --vocab-size 256)
    off_batch=4 off_warmup=1 off_steps=2 xl_batch=2 xl_steps=2
  fi
  local threads
  threads="$(nproc)"
  "$py" "$ref" init "${medium[@]}" --seed 1337 --out "$out/init_medium.safetensors" >>"$log" 2>&1
  local otrain=(timeout 300 "$BUNDLE/bin/train" --nproc 1 --threads "$threads" --device "$device"
                --data synthetic "${medium[@]}" --batch-size "$off_batch" --lr 3e-4
                --val-every 1000000 --progress-bar 0 --seed 1337
                --init-from "$out/init_medium.safetensors" --mixed-precision bf16
                --steps $((off_warmup + off_steps)))
  FSDP2_BACKEND=nccl "${otrain[@]}" --out-dir "$out/offload_none" >"$out/offload_none.log" 2>&1
  FSDP2_BACKEND=nccl "${otrain[@]}" --cpu-offload 1 --out-dir "$out/offload_clip" \
    >"$out/offload_clip.log" 2>&1
  FSDP2_BACKEND=nccl "${otrain[@]}" --cpu-offload 1 --clip 0 --out-dir "$out/offload_noclip" \
    >"$out/offload_noclip.log" 2>&1
  cat "$out"/offload_*.log >>"$log"
  local o
  for o in "" --offload; do
    OMP_NUM_THREADS="$threads" "$py" "$ref" train --mode fsdp2 --adamw fused --precision bf16 \
      "${medium[@]}" $o --seed 1337 --device "$device" --init "$out/init_medium.safetensors" \
      --batch-size "$off_batch" --steps "$off_steps" --warmup "$off_warmup" \
      --json "$out/torch_offload${o:+_on}.json" >>"$log" 2>&1
  done
  local xtrain=(timeout 400 "$BUNDLE/bin/train" --nproc 1 --threads "$threads" --device "$device"
                --data synthetic "${xl[@]}" --batch-size "$xl_batch" --lr 3e-4 --val-every 1000000
                --progress-bar 0 --seed 1337 --mixed-precision bf16 --activation-checkpointing 1
                --gpu-memory-limit "$cap" --steps "$xl_steps")
  FSDP2_BACKEND=nccl "${xtrain[@]}" --cpu-offload 1 --out-dir "$out/xl_offload" \
    >"$out/xl_offload.log" 2>&1
  echo "exit $?" >>"$out/xl_offload.log"
  FSDP2_BACKEND=nccl "${xtrain[@]}" --out-dir "$out/xl_none" >"$out/xl_none.log" 2>&1
  echo "exit $?" >>"$out/xl_none.log"
  cat "$out"/xl_*.log >>"$log"

  # The kernels one by one against their composites, and a trace of two
  # fsdp2 steps (after one untraced) for ui.perfetto.dev.
  step kernels
  local krows=(--rows 8192 --iters 10)
  [[ $dry == 1 ]] && krows=(--rows 64 --iters 2 --warmup 1 --seq 16)
  timeout 120 "$BUNDLE/bin/kernels" --device "$device" "${krows[@]}" >"$out/kernels.txt" 2>&1 ||
    echo "kernels: exit $?" >>"$out/kernels.txt"
  cat "$out/kernels.txt" >>"$log"
  step profile
  FSDP2_BACKEND=nccl "${train[@]}" --mixed-precision bf16 --steps 3 --profile 2 \
    --profile-path "$out/trace.json" --out-dir "$out/fsdp2_profile" >>"$log" 2>&1 &&
    gzip -f "$out/trace.json"

  # The table ends with the verdict; table.py's exit status is the verdict's.
  "$py" "$HERE/table.py" --out "$out" --warmup "$warmup" --batch-size "$batch" \
    --big-batch-size "$big_batch" \
    --offload-steps "$xl_steps" $([[ $dry == 1 ]] && echo --dry-run) \
    --block-size "$(printf '%s\n' "${sizes[@]}" | sed -n '/--block-size/{n;p}')" >"$out/table.md"
  local verdict=$?
  cat "$out/table.md"
  cat "$out/table.md" >>"$log"
  if [[ $verdict != 0 ]]; then
    echo "gpu_check: NOT everything passed (exit 1); the full log: $log" | tee -a "$log"
    return 1
  fi
  return 0
}

# One line of tests.txt for test binary $1 that exited $2, its output in
# $3; $4: 1 in a dry run. FAILED: a non-zero exit (a timeout included) or
# no case run; SKIPPED: the binary said so (no GPU), or a case was skipped
# outside a dry run; else PASSED with its number of cases (and, in a dry
# run, how many of its cases need a real GPU).
test_result() {
  local name=$1 rc=$2 log=$3 dry=$4 ok skipped
  ok=$(grep -c '^\[       OK \]' "$log")
  skipped=$(grep -cE '^\[  SKIPPED \] [A-Za-z0-9_/]+\.[A-Za-z0-9_/]+ \([0-9]+ ms\)' "$log")
  if [[ $rc != 0 ]]; then
    echo "$name FAILED (exit $rc; $(grep -c '^\[  FAILED  \]' "$log") failed lines)"
  elif grep -q '^SKIPPED:' "$log"; then
    echo "$name SKIPPED ($(grep -m1 '^SKIPPED:' "$log" | cut -c10-))"
  elif [[ $skipped != 0 && $dry != 1 ]]; then
    echo "$name SKIPPED ($skipped cases skipped)"
  elif [[ $ok == 0 ]]; then
    echo "$name FAILED (no case ran)"
  elif [[ $skipped != 0 ]]; then
    echo "$name PASSED ($ok cases; $skipped cases need a GPU: not run in a dry run)"
  else
    echo "$name PASSED ($ok cases)"
  fi
}

case "${1:-}" in
  pack) pack ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 pack | run [--dry-run]"; exit 2 ;;
esac
