#!/usr/bin/env bash
# Two hosts on one machine (network namespaces joined by a veth pair, as
# //tests:multihost_test makes them; needs root): the main job's defaults on
# 2 hosts x 2 ranks, one after the other: FULL_SHARD (and resharding after
# forward only down to a host's 2 ranks, --reshard-after-forward 2),
# HYBRID_SHARD (and 4 micro-batches accumulated locally or reduce-scattered
# each, --grad-accum-mode), NO_SHARD. Prints each run's median step time (rank 0's, steps 3 and
# on) and the bytes that crossed the host boundary per step (counted on the
# veth, both directions). Extra arguments go to every run.
#
#   bazel run -c opt //bench:two_hosts -- --steps 20
set -uo pipefail
train="$(realpath "$1")"; shift
hosts_lib="$(realpath "$1")"; shift
tmp=$(mktemp -d)
test_name=two_hosts
source "$hosts_lib"

bytes() {  # both directions on host0's end of the veth
  ip -n "$nsa" -s link show "$va" | awk '/RX:|TX:/ {getline; s += $1} END {print s}'
}
configs=("full_shard" "full_shard --reshard-after-forward 2" "hybrid_shard"
         "hybrid_shard --grad-accum 4 --grad-accum-mode local"
         "hybrid_shard --grad-accum 4 --grad-accum-mode sharded" "no_shard")
printf "%-56s %10s %16s %6s\n" run "step ms" "MiB across/step" "steps"
for config in "${configs[@]}"; do
  read -r -a extra <<<"$config"
  strategy=$(tr ' ' '_' <<<"$config" | tr -d '-')
  port=$(( 20000 + RANDOM % 20000 )); pids=()
  before=$(bytes)
  for r in 0 1 2 3; do
    start_rank $(( r / 2 )) "$tmp/$strategy.$r.log" RANK=$r WORLD_SIZE=4 LOCAL_RANK=$(( r % 2 )) \
      LOCAL_WORLD_SIZE=2 MASTER_ADDR=10.231.7.1 MASTER_PORT=$port -- "$train" --strategy "${extra[@]}" \
      --progress-bar 0 --metrics-out "$tmp/$strategy.jsonl" --out-dir "$tmp/$strategy" "$@"
    pids+=($!)
  done
  ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  if [[ $ok -ne 1 ]]; then echo "$config failed:"; tail -3 "$tmp/$strategy".*.log; continue; fi
  crossed=$(( $(bytes) - before ))
  steps=$(wc -l < "$tmp/$strategy.jsonl")
  ms=$(grep -o '"step_ms": [0-9.]*' "$tmp/$strategy.jsonl" | awk 'NR > 2 {print $2}' | sort -n |
       awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
  printf "%-56s %10.1f %16.2f %6d\n" "$config" "$ms" "$(awk -v b=$crossed -v s=$steps 'BEGIN {print b / s / 1048576}')" "$steps"
done
rm -rf "$tmp"
