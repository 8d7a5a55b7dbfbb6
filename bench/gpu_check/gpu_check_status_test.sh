#!/usr/bin/env bash
# The GPU check's exit status is its verdict: gpu_check.sh run (and run
# --dry-run) on a copy of the check whose bundle and PyTorch side are fakes
# (shell scripts printing what the real ones print), one thing wrong at a
# time: a FAILED test, a SKIPPED test, a skipped case, the fp32 target NOT
# met, a run that failed. Each must exit 1 with the reason in the verdict;
# everything right must exit 0. The fake tests also fail unless they get
# FSDP2_REQUIRE_GPU=1 (run) or FSDP2_GPU_TEST_DRY_RUN=1 (dry run).
# args: gpu_check.sh table.py
set -uo pipefail
check_sh="$1"
table_py="$2"
tmp="${TEST_TMPDIR:-/tmp}/gpu_check_status"
rm -rf "$tmp"
root="$tmp/root"
mkdir -p "$root/bench/gpu_check" "$root/gpu_bundle/bin" "$root/gpu_bundle/lib" "$tmp/site/torch/lib"
cp "$check_sh" "$table_py" "$root/bench/gpu_check/"
chmod +x "$root/bench/gpu_check/gpu_check.sh"

# Python: the real one for table.py and the fake reference; torch's questions
# (where it lives, its versions) answered without torch.
cat >"$tmp/python" <<PY
#!/bin/sh
if [ "\$1" = "-c" ]; then
  case "\$2" in
    *dirname*) echo "$tmp/site" ;;
    *) echo "torch 2.11.0+cu130 cuda 13.0 nccl 2.28.9 gpu NVIDIA H200" ;;
  esac
  exit 0
fi
exec /usr/bin/python3 "\$@"
PY
chmod +x "$tmp/python"

# PyTorch's side: losses 2.0, 1.99, ... (FAKE_EAGER_OFFSET added).
cat >"$root/bench/gpu_check/torch_reference.py" <<'PY'
import json, os, sys
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
if args[0] == "init":
    open(value("--out"), "w").write("init")
else:
    steps = int(value("--steps"))
    offset = float(os.environ.get("FAKE_EAGER_OFFSET", "0"))
    json.dump({"losses": [2.0 - 0.01 * i + offset for i in range(steps)],
               "median_step_s": 0.1, "tokens_per_s": 81920, "params": 124_000_000,
               "peak_allocated_bytes": 2 << 30}, open(value("--json"), "w"))
PY

# fsdp2's main job: metrics.jsonl in --out-dir, the peak line on stdout.
# FAKE_TRAIN_FAILS=bf16 fails the bf16 runs. Under --gpu-memory-limit
# without --cpu-offload (the XL row) it runs out of memory, as on a GPU,
# unless FAKE_XL_FITS=1; FAKE_OFFLOAD_FAILS=1 fails every --cpu-offload run.
cat >"$root/gpu_bundle/bin/train" <<'SH'
#!/usr/bin/env bash
steps=0 out= precision= cap= offload=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift ;;
    --out-dir) out=$2; shift ;;
    --mixed-precision) precision=$2; shift ;;
    --gpu-memory-limit) cap=$2; shift ;;
    --cpu-offload) offload=$2; shift ;;
    --batch-size | --profile | --profile-path) shift ;;
  esac
  shift
done
[[ "${FAKE_TRAIN_FAILS:-}" == "$precision" ]] && { echo "fake train: failed"; exit 1; }
[[ "${FAKE_OFFLOAD_FAILS:-}" == 1 && $offload == 1 ]] && { echo "fake train: failed"; exit 1; }
if [[ -n $cap && $offload == 0 && "${FAKE_XL_FITS:-}" != 1 ]]; then
  echo "train: out of memory: CUDA out of memory. Tried to allocate 1.00 GiB"; exit 1
fi
mkdir -p "$out"
for ((i = 0; i < steps; ++i)); do
  echo "{\"loss\": $(awk "BEGIN {print 2.0 - 0.01 * $i}"), \"step_ms\": 100}"
done >"$out/metrics.jsonl"
echo "rank 0: cuda:0 memory: peak allocated 1024.0 MiB, peak reserved 1100.0 MiB"
SH

# bench/kernels: its table, or FAKE_KERNELS=fail: an exit before its end.
cat >"$root/gpu_bundle/bin/kernels" <<'SH'
#!/usr/bin/env bash
echo "kernels on cuda, bf16, 8192 rows; CUDA kernels running"
[[ "${FAKE_KERNELS:-}" == fail ]] && { echo "kernels: CUDA error"; exit 1; }
echo "layer_norm 0.05 0.10 2.00x"
SH

# The GPU tests: FAKE_<NAME>=pass|fail|skip|skipcase.
for t in gpu_test nccl_transport_test kernels_gpu_test; do
  cat >"$root/gpu_bundle/bin/$t" <<SH
#!/usr/bin/env bash
name=$t
SH
  cat >>"$root/gpu_bundle/bin/$t" <<'SH'
var="FAKE_${name^^}"
mode=${!var:-pass}
if [[ "${FAKE_DRY:-0}" == 1 ]]; then
  [[ "${FSDP2_GPU_TEST_DRY_RUN:-}" == 1 && -z "${FSDP2_REQUIRE_GPU:-}" ]] ||
    { echo "[  FAILED  ] the dry run's variables are wrong"; exit 3; }
else
  [[ "${FSDP2_REQUIRE_GPU:-}" == 1 && -z "${FSDP2_GPU_TEST_DRY_RUN:-}" ]] ||
    { echo "[  FAILED  ] FSDP2_REQUIRE_GPU=1 is not set"; exit 3; }
fi
case "$mode" in
  pass) printf '[       OK ] T.A (1 ms)\n[       OK ] T.B (2 ms)\n[  PASSED  ] 2 tests.\n' ;;
  fail) printf '[       OK ] T.A (1 ms)\n[  FAILED  ] T.B (2 ms)\n[  FAILED  ] 1 test, listed below:\n[  FAILED  ] T.B\n'; exit 1 ;;
  skip) echo "SKIPPED: $name: no CUDA device is visible" ;;
  skipcase) printf '[       OK ] T.A (1 ms)\n[  SKIPPED ] T.B (0 ms)\n[  PASSED  ] 1 test.\n[  SKIPPED ] 1 test, listed below:\n[  SKIPPED ] T.B\n' ;;
esac
exit 0
SH
done
chmod +x "$root/gpu_bundle/bin/"*

fail=0
# expect STATUS WORDS... -- VAR=VALUE... [--dry-run]: runs the check with
# the variables set, wants exit STATUS and each of WORDS in its output.
expect() {
  local want=$1; shift
  local words=()
  while [[ $1 != -- ]]; do words+=("$1"); shift; done
  shift
  local vars=() dry=()
  for a in "$@"; do
    if [[ $a == --dry-run ]]; then dry=(--dry-run); vars+=(FAKE_DRY=1); else vars+=("$a"); fi
  done
  local out status
  out=$(env "${vars[@]}" FSDP2_GPU_PYTHON="$tmp/python" OUT="$tmp/out" \
          "$root/bench/gpu_check/gpu_check.sh" run "${dry[@]}" 2>&1)
  status=$?
  local what="${vars[*]} ${dry[*]}"
  if [[ $status != "$want" ]]; then
    echo "FAIL: [$what] exited $status, want $want"; echo "$out" | tail -25; fail=1; return
  fi
  for w in "${words[@]}"; do
    if ! grep -qF -- "$w" <<<"$out"; then
      echo "FAIL: [$what] printed no '$w'"; echo "$out" | tail -25; fail=1; return
    fi
  done
  echo "ok: [$what] exit $status"
}

expect 0 "Verdict: passed" "gpu_test | PASSED (2 cases)" -- X=1
expect 1 "Verdict: NOT passed" "gpu_test FAILED (exit 1; 3 failed lines)" -- FAKE_GPU_TEST=fail
expect 1 "nccl_transport_test SKIPPED (nccl_transport_test: no CUDA device" -- FAKE_NCCL_TRANSPORT_TEST=skip
expect 1 "gpu_test SKIPPED (1 cases skipped)" -- FAKE_GPU_TEST=skipcase
expect 1 "fp32 losses: the target (1e-4) NOT met" -- FAKE_EAGER_OFFSET=0.01
expect 1 "bf16 run failed: fsdp2" "bf16 run failed: fsdp2, activation checkpointing" -- FAKE_TRAIN_FAILS=bf16
expect 1 "fp32 losses: fsdp2 missing" -- FAKE_TRAIN_FAILS=fp32
expect 1 "offload run failed: fsdp2, cpu offload (clip 1.0)" "GPT-2 XL under the cap: wanted trains" -- FAKE_OFFLOAD_FAILS=1
expect 1 "GPT-2 XL under the cap: wanted out of memory" -- FAKE_XL_FITS=1
expect 1 "kernels_gpu_test FAILED" -- FAKE_KERNELS_GPU_TEST=fail
expect 1 "bench/kernels did not run to its end" -- FAKE_KERNELS=fail
# The dry run: GPU-only cases may be skipped there, nothing else.
expect 0 "Verdict: passed" "1 cases need a GPU: not run in a dry run" -- FAKE_NCCL_TRANSPORT_TEST=skipcase --dry-run
expect 1 "gpu_test SKIPPED" -- FAKE_GPU_TEST=skip --dry-run
expect 1 "nccl_transport_test FAILED" -- FAKE_NCCL_TRANSPORT_TEST=fail --dry-run
expect 1 "fp32 losses: the target (1e-4) NOT met" -- FAKE_EAGER_OFFSET=0.01 --dry-run
# On the CPU nothing runs out of GPU memory: the XL rows state no verdict.
expect 0 "Verdict: passed" "dry run: out of memory" -- FAKE_XL_FITS=1 --dry-run
[[ $fail == 0 ]] && echo "gpu_check_status_test: passed"
exit $fail
