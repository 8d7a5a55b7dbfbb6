#!/usr/bin/env bash
# Two hosts on one machine, as users run several: each host is a network
# namespace with its own host name (unshare --uts), joined to the other by a
# veth pair, and runs 2 ranks of the main job started torchrun-style (RANK,
# WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; no
# GLOO_SOCKET_IFNAME, so the job must find the interface itself).
#
# Every strategy on 2 hosts x 2 ranks must print the losses of one process
# training the same global batch and end with its parameters; HYBRID_SHARD must shard within each host
# (DeviceMesh(replicate=2, shard=2), half of the parameters per rank) and
# send fewer bytes between the hosts than FULL_SHARD (counted on the veth).
# Needs root (tests/hosts_lib.sh makes the hosts, or says SKIPPED).
set -uo pipefail
train="$1"
load_safetensors="$2"  # core/checkpoint/load_safetensors.py
tmp="${TEST_TMPDIR:-/tmp}"
fail=0

test_name=multihost_test
source "$(dirname "$0")/hosts_lib.sh"

common=(--steps 3 --n-layer 2 --n-embd 32 --n-head 2 --block-size 32 --threads 1 --log-every 1)
losses() { grep -o ' loss [0-9][0-9.]*' | awk '{print $2}'; }
# sent_mib LINE KIND: the MiB a rank's final line says it sent through KIND
# ("shm" or "gloo"), 0 if none.
sent_mib() { grep -oE "$2 [0-9.]+ MiB" <<<"$1" | awk '{print $2} END { if (NR == 0) print 0 }'; }
tx_bytes() { ip -n "$nsa" -s link show "$va" | awk '/TX:/ {getline; print $1}'; }

one=$(timeout 300 "$train" --nproc 1 --batch-size 8 "${common[@]}" --out-dir "$tmp/one" \
  --ckpt-dir "$tmp/ck-one" --checkpoint-format full 2>&1) \
  || { echo "FAIL: one process"; echo "$one"; exit 1; }
l1=$(echo "$one" | losses)
[[ -n "$l1" ]] || { echo "FAIL: no losses from one process"; echo "$one"; exit 1; }

# Starts 2 hosts x 2 ranks of the main job with `strategy`; prints rank 0's
# output then every other rank's, each line prefixed.
# Extra arguments go to every rank; RUN_NAME (default: the strategy) names
# its logs and checkpoint.
run_hosts() {
  local strategy="$1" port=$(( 20000 + RANDOM % 20000 ))
  shift
  local name="${RUN_NAME:-$strategy}" pids=() r
  for r in 0 1 2 3; do
    start_rank $(( r / 2 )) "$tmp/$name.$r.log" RANK=$r WORLD_SIZE=4 \
      LOCAL_RANK=$(( r % 2 )) LOCAL_WORLD_SIZE=2 MASTER_ADDR=10.231.7.1 \
      MASTER_PORT=$port FSDP2_TIMEOUT_S=60 -- timeout 300 "$train" --batch-size 2 \
      "${common[@]}" --strategy "$strategy" --out-dir "$tmp/$name-$r" \
      --ckpt-dir "$tmp/ck-$name" --checkpoint-format full "$@"
    pids+=($!)
  done
  local status=0
  for r in 0 1 2 3; do wait "${pids[$r]}" || status=1; done
  for r in 0 1 2 3; do sed "s/^/[rank $r] /" "$tmp/$name.$r.log"; done
  return $status
}

declare -A crossed
for strategy in full_shard shard_grad_op no_shard hybrid_shard; do
  before=$(tx_bytes)
  out=$(run_hosts "$strategy") || { echo "FAIL: $strategy on 2 hosts x 2 ranks exited non-zero:"; echo "$out"; fail=1; continue; }
  crossed[$strategy]=$(( $(tx_bytes) - before ))
  l=$(grep '^\[rank 0\]' <<<"$out" | losses)
  if [[ "$l" != "$l1" ]]; then
    echo "FAIL: $strategy on 2 hosts x 2 ranks differs from one process:"
    paste <(echo "$l1") <(echo "$l"); echo "$out"; fail=1
  fi
  if ! grep -q '^\[rank 0\] hosts: 2; gloo: route to MASTER_ADDR via '"$va"' (10.231.7.1)' <<<"$out"; then
    echo "FAIL: $strategy: rank 0 should find 2 hosts and reach MASTER_ADDR through $va:"
    grep '^\[rank 0\]' <<<"$out"; fail=1
  fi
  # The parameters at the end (full checkpoints, every tensor by name).
  if ! cmp=$("$FSDP2_PYTHON" - "$load_safetensors" "$tmp/ck-one/checkpoint.safetensors" \
        "$tmp/ck-$strategy/checkpoint.safetensors" <<'PY' 2>&1
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("st", sys.argv[1])
st = importlib.util.module_from_spec(spec); spec.loader.exec_module(st)
a, _ = st.load_safetensors(sys.argv[2])
b, _ = st.load_safetensors(sys.argv[3])
names = [n for n in a if not n.startswith("optim/")]
assert names and sorted(names) == sorted(n for n in b if not n.startswith("optim/")), "names differ"
# Per tensor, the norm of the difference against the tensor's norm (fp32:
# AdamW's normalised steps turn rounding in near-zero gradients into
# lr-sized differences of single elements, so not element by element). The
# same run on 2 or 4 ranks of one host ends 2-2.5e-5 from one process (worst
# on a zero-initialised bias); float64 equality is //tests:fsdp_equivalence_test's.
worst = max(float(np.linalg.norm((a[n] - b[n]).ravel()) / max(np.linalg.norm(a[n].ravel()), 1e-12))
            for n in names)
print("%d parameters, worst relative difference (norm) %.1e" % (len(names), worst))
sys.exit(0 if worst < 1e-4 else 1)
PY
  ); then
    echo "FAIL: $strategy: parameters at the end differ from one process: $cmp"; fail=1
  else
    echo "$strategy: parameters equal one process ($cmp)"
  fi
  echo "$strategy: losses equal one process; bytes host0 -> host1 ${crossed[$strategy]} (3 steps)"
  # What each rank sent, by transport: a group spanning both hosts goes
  # over TCP (Gloo) only; HYBRID_SHARD's shard groups stay within a host
  # and go through shared memory.
  for r in 0 1 2 3; do
    line=$(grep "^\[rank $r\] rank $r: sharded params" <<<"$out")
    shm=$(sent_mib "$line" shm) gloo=$(sent_mib "$line" gloo)
    if [[ $strategy == hybrid_shard ]]; then
      if ! awk -v a="$shm" -v b="$gloo" 'BEGIN { exit !(a > 0 && b > 0) }'; then
        echo "FAIL: hybrid_shard rank $r should send within its host over shared memory and across hosts over Gloo: $line"; fail=1
      fi
    elif ! awk -v a="$shm" -v b="$gloo" 'BEGIN { exit !(a == 0 && b > 0) }'; then
      echo "FAIL: $strategy rank $r: its groups span both hosts, so Gloo only: $line"; fail=1
    fi
  done
  grep "^\[rank 0\] rank 0: sharded" <<<"$out" | sed "s/^/  $strategy: /"
  if [[ $strategy == hybrid_shard ]]; then
    if ! grep -q 'DeviceMesh(replicate=2, shard=2)' <<<"$out"; then
      echo "FAIL: hybrid_shard should shard within each host: DeviceMesh(replicate=2, shard=2):"
      grep '^\[rank 0\]' <<<"$out"; fail=1
    fi
    # Every rank holds half of the parameters (its host's shard group is 2).
    while read -r have total; do
      if ! awk -v h="$have" -v t="$total" 'BEGIN { exit !(h > 0.45 * t && h < 0.55 * t) }'; then
        echo "FAIL: hybrid_shard: a rank holds $have of $total MiB, not half"; fail=1
      fi
    done < <(grep -o 'sharded params [0-9.]* MiB of [0-9.]* MiB' <<<"$out" | awk '{print $3, $6}')
    if [[ $(grep -c 'sharded params' <<<"$out") -ne 4 ]]; then
      echo "FAIL: hybrid_shard: expected 4 ranks' parameter lines"; fail=1
    fi
  fi
done
if [[ -n "${crossed[hybrid_shard]:-}" && -n "${crossed[full_shard]:-}" ]] &&
   (( crossed[hybrid_shard] >= crossed[full_shard] )); then
  echo "FAIL: hybrid_shard sent ${crossed[hybrid_shard]} bytes between the hosts, not fewer than full_shard's ${crossed[full_shard]}"
  fail=1
fi

# fully_shard's controls across the host boundary: HYBRID_SHARD with 4
# micro-batches that reduce-scatter inside each host every micro-batch and
# all-reduce across the hosts only at the last (--grad-accum-mode sharded),
# with prefetch depth 2, trains as one process does with 4 micro-batches
# and sends no more bytes between the hosts than with 1 micro-batch (the
# veth counts rendezvous and loss reductions too: 10% slack).
one4=$(timeout 300 "$train" --nproc 1 --batch-size 16 --grad-accum 4 "${common[@]}" \
  --out-dir "$tmp/one4" 2>&1) || { echo "FAIL: one process, 4 micro-batches"; echo "$one4"; fail=1; }
before=$(tx_bytes)
if out=$(RUN_NAME=hsdp-accum run_hosts hybrid_shard --batch-size 4 --grad-accum 4 \
      --grad-accum-mode sharded --prefetch-depth 2); then
  accum_crossed=$(( $(tx_bytes) - before ))
  l=$(grep '^\[rank 0\]' <<<"$out" | losses)
  if [[ "$l" != "$(echo "$one4" | losses)" ]]; then
    echo "FAIL: hybrid_shard, 4 sharded micro-batches on 2 hosts differs from one process:"
    paste <(echo "$one4" | losses) <(echo "$l"); echo "$out"; fail=1
  fi
  if [[ -n "${crossed[hybrid_shard]:-}" ]] &&
     (( accum_crossed * 10 > crossed[hybrid_shard] * 11 )); then
    echo "FAIL: 4 sharded micro-batches sent $accum_crossed bytes between the hosts, more than 1 micro-batch's ${crossed[hybrid_shard]}"
    fail=1
  fi
  echo "hybrid_shard, 4 micro-batches reduce-scattered each, prefetch 2: losses equal one process; bytes host0 -> host1 $accum_crossed (1 micro-batch: ${crossed[hybrid_shard]:-?})"
else
  echo "FAIL: hybrid_shard with --grad-accum-mode sharded on 2 hosts x 2 ranks exited non-zero:"; echo "$out"; fail=1
fi

# FULL_SHARD resharding after forward only down to each host's 2 ranks
# (--reshard-after-forward 2, hpZ): backward all-gathers inside the host,
# so fewer bytes cross than with full resharding, and the losses are still
# one process's.
before=$(tx_bytes)
if out=$(RUN_NAME=fsdp-hpz run_hosts full_shard --reshard-after-forward 2); then
  hpz_crossed=$(( $(tx_bytes) - before ))
  l=$(grep '^\[rank 0\]' <<<"$out" | losses)
  if [[ "$l" != "$l1" ]]; then
    echo "FAIL: full_shard --reshard-after-forward 2 on 2 hosts differs from one process:"
    paste <(echo "$l1") <(echo "$l"); echo "$out"; fail=1
  fi
  if [[ -n "${crossed[full_shard]:-}" ]] && (( hpz_crossed >= crossed[full_shard] )); then
    echo "FAIL: --reshard-after-forward 2 sent $hpz_crossed bytes between the hosts, not fewer than full resharding's ${crossed[full_shard]}"
    fail=1
  fi
  echo "full_shard --reshard-after-forward 2: losses equal one process; bytes host0 -> host1 $hpz_crossed (full resharding: ${crossed[full_shard]:-?})"
else
  echo "FAIL: full_shard --reshard-after-forward 2 on 2 hosts x 2 ranks exited non-zero:"; echo "$out"; fail=1
fi

# Explicit prefetch lists (the root's, forward and backward, and a block's)
# and an ignored parameter whose gradient backward() all-reduces, by name
# through the main job's flags: one process with the same flags prints the
# same losses (the ignored embedding is not cast to bf16 in either).
ctl=(--ignored-params wpe.weight --ignored-params-all-reduce 1
     --forward-prefetch-modules ":blocks.1,blocks.0"
     --backward-prefetch-modules ":blocks.0,blocks.1;blocks.1:blocks.0")
if one_ctl=$(timeout 300 "$train" --nproc 1 --batch-size 8 "${common[@]}" "${ctl[@]}" \
      --out-dir "$tmp/one-ctl" 2>&1) &&
   out=$(RUN_NAME=fsdp-lists run_hosts full_shard "${ctl[@]}"); then
  l=$(grep '^\[rank 0\]' <<<"$out" | losses)
  if [[ -z "$l" || "$l" != "$(echo "$one_ctl" | losses)" ]]; then
    echo "FAIL: full_shard with prefetch lists and an ignored parameter on 2 hosts differs from one process:"
    paste <(echo "$one_ctl" | losses) <(echo "$l"); echo "$out"; fail=1
  fi
  echo "full_shard, prefetch lists, ignored wpe.weight all-reduced: losses equal one process"
else
  echo "FAIL: prefetch lists and ignored parameters on 1 process or 2 hosts x 2 ranks exited non-zero:"
  echo "${one_ctl:-}"; echo "${out:-}"; fail=1
fi

# A job on 2 hosts whose MASTER_ADDR is loopback cannot know the network
# between them: each rank on host 0 must say so and name GLOO_SOCKET_IFNAME.
# (The file store lets the ranks meet without TCP.)
store="$tmp/store.$$"
rm -f "$store"
pids=()
for r in 0 1; do
  start_rank $r "$tmp/lo.$r.log" RANK=$r WORLD_SIZE=2 FSDP2_STORE_PATH="$store" \
    FSDP2_TIMEOUT_S=30 -- timeout 120 "$train" "${common[@]}" --batch-size 4 --out-dir "$tmp/lo-$r"
  pids+=($!)
done
for r in 0 1; do
  if wait "${pids[$r]}"; then echo "FAIL: rank $r of a 2-host job without an interface succeeded"; fail=1; fi
  if ! grep -q "run on 2 hosts.*GLOO_SOCKET_IFNAME" "$tmp/lo.$r.log"; then
    echo "FAIL: rank $r should say the 2 hosts need GLOO_SOCKET_IFNAME:"; cat "$tmp/lo.$r.log"; fail=1
  fi
done

if [[ $fail -ne 0 ]]; then exit 1; fi
echo "multihost_test: all checks passed"
