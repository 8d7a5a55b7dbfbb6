#!/usr/bin/env bash
# Faults across hosts (2 namespace hosts x 2 ranks, tests/hosts_lib.sh): a
# rank killed with SIGKILL, a network partition mid-step and a rank that
# never arrives must each end every other rank with a non-zero exit and an
# error that says what happened, within a bound, never a hang.
set -uo pipefail
train="$1"
tmp="${TEST_TMPDIR:-/tmp}"
fail=0

test_name=multihost_faults_test
source "$(dirname "$0")/hosts_lib.sh"

common=(--n-layer 2 --n-embd 32 --n-head 2 --block-size 32 --threads 1 --log-every 1
        --batch-size 2 --data synthetic)

# start_job NAME TIMEOUT_S RANKS...: starts those ranks of a 4-rank job in
# the background (pids in pid[RANK], the ranks in ranks[NAME]), logs in
# $tmp/NAME.RANK.log. No `timeout` wrapper, so each pid is the training
# process itself.
declare -A pid ranks
start_job() {
  local name="$1" timeout_s="$2" port=$(( 20000 + RANDOM % 20000 )); shift 2
  local r
  ranks[$name]="$*"
  for r in "$@"; do
    start_rank $(( r / 2 )) "$tmp/$name.$r.log" RANK=$r WORLD_SIZE=4 LOCAL_RANK=$(( r % 2 )) \
      LOCAL_WORLD_SIZE=2 MASTER_ADDR=10.231.7.1 MASTER_PORT=$port FSDP2_TIMEOUT_S=$timeout_s \
      -- "$train" --steps 100000 "${common[@]}" --out-dir "$tmp/$name-$r"
    pid[$r]=$!
  done
}
# wait_for_step NAME: until rank 0 has logged a training loss (at most 120 s).
# A job that gets no step that far fails the test, and its ranks are killed
# so that none lingers into the next case.
wait_for_step() {
  local i r
  for i in $(seq 1200); do
    grep -q ' loss [0-9]' "$tmp/$1.0.log" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "FAIL: $1: no training step within 120 s"; cat "$tmp/$1".*.log; fail=1
  for r in ${ranks[$1]}; do kill -9 "${pid[$r]}" 2>/dev/null; wait "${pid[$r]}" 2>/dev/null; done
  return 1
}
# expect_exit NAME MAX_S PATTERN RANKS...: each rank must exit non-zero
# within MAX_S seconds (from now) with PATTERN in its output.
expect_exit() {
  local name="$1" max_s="$2" pattern="$3"; shift 3
  local start=$SECONDS r
  for r in "$@"; do
    while kill -0 "${pid[$r]}" 2>/dev/null && (( SECONDS - start <= max_s + 60 )); do sleep 0.2; done
    if kill -0 "${pid[$r]}" 2>/dev/null; then
      echo "FAIL: $name: rank $r still runs $((SECONDS - start)) s later (a hang)"; kill -9 "${pid[$r]}"; fail=1
      continue
    fi
    wait "${pid[$r]}"; local code=$?
    local took=$((SECONDS - start))
    if (( code == 0 )) || (( took > max_s )) || ! grep -qE "$pattern" "$tmp/$name.$r.log"; then
      echo "FAIL: $name: rank $r exited $code after ${took} s; wanted non-zero within $max_s s with /$pattern/:"
      tail -5 "$tmp/$name.$r.log"; fail=1
    else
      echo "$name: rank $r exited $code after <= ${took} s: $(grep -E "$pattern" "$tmp/$name.$r.log" | head -1)"
    fi
  done
}

# 1. Rank 3 (host1) is killed mid-run: the others name it within 30 s.
start_job kill 60 0 1 2 3
if wait_for_step kill; then
  kill -9 "${pid[3]}"
  wait "${pid[3]}" 2>/dev/null
  expect_exit kill 30 "lost: rank 3 \(host 'host1'\)" 0 1 2
fi

# 2. The link between the hosts goes down mid-step: every rank ends with a
# timeout error after the configured 15 s (plus the time to notice). A rank
# whose collective waits on a peer of its own host may instead see that peer
# exit after its timeout; it must then name the other host's ranks as lost.
start_job partition 15 0 1 2 3
if wait_for_step partition; then
  ip -n "$nsa" link set "$va" down
  expect_exit partition 75 \
    "[Tt]imed? ?out|timeout|lost: rank 2 \(host 'host1'\), rank 3 \(host 'host1'\)" 0 1 2 3
  ip -n "$nsa" link set "$va" up
fi

# 3. Rank 3 never arrives: the others stop at rendezvous after 10 s.
start_job absent 10 0 1 2
expect_exit absent 40 "rank 3 of 4 did not arrive within 10 s" 0 1 2

if [[ $fail -ne 0 ]]; then exit 1; fi
echo "multihost_faults_test: all checks passed"
