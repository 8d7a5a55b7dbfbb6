#!/usr/bin/env bash
# fully_shard's controls on the 85M GPT (12 layers, n_embd 768, 12 heads,
# 256-token vocabulary: GPT-2 small's blocks), the main job's shipped
# defaults otherwise, one run per row, side by side:
#  - prefetch depth 0, 1 (the default), 2, 3 with FULL_SHARD on 2 ranks;
#  - gradient accumulation with 4 micro-batches under HYBRID_SHARD on
#    4 ranks (2 replicas x 2 shards): "local" (unsharded gradients kept
#    until the last micro-batch) against "sharded" (reduce-scattered every
#    micro-batch, all-reduced across replicas at the last).
# Per row: the median step time (rank 0's, steps 3 and on), the largest
# peak RSS over the ranks, the largest peak of all-gathered parameter bytes
# alive at once (the engine's count), and the ratios to the row's baseline.
# With --pytorch 1 each prefetch row is followed by PyTorch's own FSDP2 on
# the same model, batch and cores (bench/python_ddp_gpt.py --fsdp2 1
# --prefetch D: explicit lists of D blocks each way; bf16 as fsdp2's
# default, fp32 when the extra flags say --mixed-precision fp32; its median
# step is the slowest rank's, its RSS the largest rank's), and the ratio
# fsdp2 / PyTorch. PyTorch's bf16 on a CPU without AVX-512 BF16 is
# several times slower than its fp32: compare in fp32 there.
#
#   bazel run -c opt //bench:controls -- [--steps N] [--rows prefetch|accum] [--pytorch 1] [extra main-job flags]
set -uo pipefail
train="$(realpath "$1")"; shift
steps=6
rows=all
pytorch=0
while [[ "${1:-}" == --steps || "${1:-}" == --rows || "${1:-}" == --pytorch ]]; do
  case "$1" in
    --steps) steps="$2" ;;
    --rows) rows="$2" ;;
    --pytorch) pytorch="$2" ;;
  esac
  shift 2
done
# PyTorch's rows follow the main job's --mixed-precision (bf16 by default).
torch_bf16=1
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; i++)); do
  [[ "${args[i]}" == --mixed-precision && "${args[i + 1]}" == fp32 ]] && torch_bf16=0
done
here="$(dirname "$(realpath "${BASH_SOURCE[0]}")")"
venv_python="${FSDP2_VENV:-/opt/fsdp2/venv}/bin/python3"  # scripts/setup.sh's
[[ -x "$venv_python" ]] || venv_python=python3
python="${FSDP2_PYTHON:-$venv_python}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=(--n-layer 12 --n-embd 768 --n-head 12 --data synthetic --vocab-size 256
       --block-size 128 --progress-bar 0 --log-every 1000 --steps "$steps")

median_ms() {
  grep -o '"step_ms": [0-9.]*' "$1" | awk 'NR > 2 {print $2}' | sort -n |
    awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}
max_field() {  # max_field LOG 'peak RSS': the largest "<field> X MiB" over the ranks
  grep -oE "$2 [0-9.]+ MiB" "$1" | awk '{v = $(NF - 1); if (v > m) m = v} END {print m + 0}'
}

# run LABEL BASELINE_LABEL ARGS...: one row.
declare -A ms rss gathered
run() {
  local label="$1" base="$2"; shift 2
  local log="$tmp/$label.log" metrics="$tmp/$label.jsonl"
  if ! "$train" "${model[@]}" --metrics-out "$metrics" --out-dir "$tmp/$label" "$@" > "$log" 2>&1; then
    echo "$label failed:"; tail -5 "$log"; return
  fi
  ms[$label]=$(median_ms "$metrics")
  rss[$label]=$(max_field "$log" 'peak RSS')
  gathered[$label]=$(max_field "$log" 'peak unsharded params')
  printf "%-28s %9.0f %12.1f %14.1f %9.3f %9.3f\n" "$label" "${ms[$label]}" "${rss[$label]}" \
    "${gathered[$label]}" "$(awk -v a="${ms[$label]}" -v b="${ms[$base]:-0}" 'BEGIN {print b ? a / b : 0}')" \
    "$(awk -v a="${rss[$label]}" -v b="${rss[$base]:-0}" 'BEGIN {print b ? a / b : 0}')"
}

# pytorch_row D: PyTorch's FSDP2 with prefetch lists of D blocks, against
# fsdp2's row "prefetch D".
pytorch_row() {
  local d="$1" label="pytorch prefetch $1" out="$tmp/pytorch$1.log"
  if ! "$python" "$here/python_ddp_gpt.py" --fsdp2 1 --bf16 "$torch_bf16" --nproc 2 --global-batch 4 \
      --n-layer 12 --n-embd 768 --n-head 12 --vocab-size 256 --block-size 128 \
      --warmup 2 --steps "$((steps > 2 ? steps - 2 : 1))" --prefetch "$d" > "$out" 2>&1; then
    echo "$label failed:"; tail -5 "$out"; return
  fi
  local s_ms r_mib
  s_ms=$(awk '/^median_step_s/ {print $2 * 1000}' "$out")
  r_mib=$(awk '/^peak_rss_mib/ {print $2}' "$out")
  printf "%-28s %9.0f %12.1f %14s %9s %9s   fsdp2/pytorch: step %.3f, RSS %.3f\n" "$label" \
    "$s_ms" "$r_mib" "-" "-" "-" \
    "$(awk -v a="${ms[prefetch $d]:-0}" -v b="$s_ms" 'BEGIN {print b ? a / b : 0}')" \
    "$(awk -v a="${rss[prefetch $d]:-0}" -v b="$r_mib" 'BEGIN {print b ? a / b : 0}')"
}

printf "%-28s %9s %12s %14s %9s %9s\n" run "step ms" "peak RSS MiB" "gathered MiB" "ms/base" "RSS/base"
if [[ $rows != accum ]]; then
  run "prefetch 1" "prefetch 1" --nproc 2 --batch-size 2 --prefetch-depth 1 "$@"
  [[ $pytorch == 1 ]] && pytorch_row 1
  for d in 0 2 3; do
    run "prefetch $d" "prefetch 1" --nproc 2 --batch-size 2 --prefetch-depth "$d" "$@"
    [[ $pytorch == 1 ]] && pytorch_row "$d"
  done
fi
if [[ $rows != prefetch ]]; then
  hsdp=(--nproc 4 --strategy hybrid_shard --shard-group-size 2 --batch-size 4 --grad-accum 4)
  run "hsdp accum 4 local" "hsdp accum 4 local" "${hsdp[@]}" --grad-accum-mode local "$@"
  run "hsdp accum 4 sharded" "hsdp accum 4 local" "${hsdp[@]}" --grad-accum-mode sharded "$@"
fi
