#!/usr/bin/env bash
# Runs a documentation snippet as two ranks, the way torchrun would start
# them: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
# MASTER_PORT set, with the allocator and OpenMP policy the local launcher
# gives its ranks, each in the same fresh working directory. Passes when both
# ranks exit 0 within the limit.
#   run_ranks.sh PROGRAM [ARGS...]
set -uo pipefail
ranks=2
limit=${SNIPPET_TIMEOUT:-180}
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/snippet.XXXXXX")
cmd=("$@")
# A program given by a relative path is made absolute (java stays java).
if [[ "${cmd[0]}" != /* && -e "${cmd[0]}" ]]; then cmd[0]="$PWD/${cmd[0]}"; fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
tcmalloc=$(ls /usr/lib/*/libtcmalloc_minimal.so.4 2>/dev/null | head -1)
pids=()
for ((r = 0; r < ranks; r++)); do
  (cd "$work" && exec env RANK=$r WORLD_SIZE=$ranks LOCAL_RANK=$r LOCAL_WORLD_SIZE=$ranks \
     MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_WAIT_POLICY=PASSIVE \
     ${tcmalloc:+LD_PRELOAD=$tcmalloc} timeout "$limit" "${cmd[@]}") \
    > "$work/rank$r.log" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < ranks; r++)); do
  wait "${pids[$r]}"; rc=$?
  echo "--- rank $r (exit $rc) ---"; cat "$work/rank$r.log"
  if [[ $rc -ne 0 ]]; then status=1; fi
done
if [[ $status -ne 0 ]]; then echo "FAIL: ${cmd[*]}"; exit 1; fi
echo PASS
