#!/usr/bin/env bash
# The main job under real outside launchers: Open MPI's mpirun (2 ranks),
# PyTorch's torchrun (2 ranks) and Slurm's srun (4 ranks, on a one-host cluster this test starts and stops
# itself: munged, slurmctld and slurmd with a private key, state and ports)
# must print the losses of one process training the same global batch.
# A launcher that cannot run here is reported on a "SKIPPED:" line (listed
# by .ci/run's summary), never skipped silently.
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # munged, slurmctld, slurmd
train="$(realpath "$1")"
tmp="${TEST_TMPDIR:-/tmp}"
fail=0
skipped=0

common=(--steps 3 --n-layer 2 --n-embd 32 --n-head 2 --block-size 32 --threads 1
        --data synthetic --log-every 1 --progress-bar 0)
losses() { grep -o ' loss [0-9][0-9.]*' | awk '{print $2}'; }
skip() { echo "SKIPPED: launchers_test: $*"; skipped=1; }

one=$(timeout 300 "$train" --nproc 1 --batch-size 8 "${common[@]}" --out-dir "$tmp/one" 2>&1) \
  || { echo "FAIL: one process"; echo "$one"; exit 1; }
l1=$(echo "$one" | losses)
[[ -n "$l1" ]] || { echo "FAIL: no losses from one process"; echo "$one"; exit 1; }

check() {  # name output expected-ranks
  local name="$1" out="$2" ranks="$3"
  if [[ "$(grep -v '^rank [1-9]' <<<"$out" | losses)" != "$l1" ]]; then
    echo "FAIL: $name differs from one process:"; echo "$out"; fail=1
  elif [[ $(grep -c 'sharded params' <<<"$out") -ne $ranks ]]; then
    echo "FAIL: $name: expected $ranks ranks to finish:"; echo "$out"; fail=1
  else
    echo "$name: $ranks ranks, losses equal one process"
  fi
}

# Open MPI.
if command -v mpirun >/dev/null; then
  out=$(timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 \
        -x MASTER_PORT=$(( 20000 + RANDOM % 20000 )) \
        "$train" --batch-size 4 "${common[@]}" --out-dir "$tmp/mpi" 2>&1)
  if [[ $? -ne 0 ]]; then echo "FAIL: mpirun -np 2:"; echo "$out"; fail=1; else check "mpirun -np 2" "$out" 2; fi
else
  skip "no mpirun (Debian's openmpi-bin)"
fi

# torchrun (the project environment's PyTorch 2.11): its agent serves the
# rendezvous store, and the ranks connect to it.
if [[ -x "${FSDP2_PYTHON:-}" ]] && "$FSDP2_PYTHON" -c "import torch.distributed.run" 2>/dev/null; then
  out=$(timeout 300 "$FSDP2_PYTHON" -m torch.distributed.run --nproc-per-node 2 --no-python \
        --master-port $(( 20000 + RANDOM % 20000 )) \
        "$train" --batch-size 4 "${common[@]}" --out-dir "$tmp/torchrun" 2>&1)
  if [[ $? -ne 0 ]]; then
    echo "FAIL: torchrun --nproc-per-node 2:"; echo "$out"; fail=1
  elif grep -q "failed to bind" <<<"$out"; then
    echo "FAIL: under torchrun rank 0 should use the agent's store, not try to serve one:"
    echo "$out"; fail=1
  else
    check "torchrun --nproc-per-node 2" "$out" 2
  fi
else
  skip "torchrun: no PyTorch in FSDP2_PYTHON (${FSDP2_PYTHON:-unset}; scripts/setup.sh)"
fi

# Slurm: a one-host cluster of our own. Unix socket paths must stay short,
# so it lives under /tmp rather than the test's deep temporary directory.
start_slurm() {
  for tool in munged slurmctld slurmd srun sinfo; do
    command -v $tool >/dev/null || { skip "srun: no $tool (Debian's slurm-wlm and munge)"; return 1; }
  done
  [[ $(id -u) -eq 0 ]] || { skip "srun: the test's own munged and slurmd need root"; return 1; }
  sd=$(mktemp -d /tmp/f2slurm.XXXXXX)
  mkdir -p "$sd/state" "$sd/spool"
  head -c 1024 /dev/urandom > "$sd/munge.key"; chmod 600 "$sd/munge.key"
  if ! munged --force --key-file="$sd/munge.key" --socket="$sd/munge.sock" \
       --pid-file="$sd/munged.pid" --log-file="$sd/munged.log" --seed-file="$sd/munge.seed"; then
    skip "srun: munged does not start: $(tail -2 "$sd/munged.log" 2>/dev/null)"; return 1
  fi
  local host port=$(( 30000 + RANDOM % 20000 ))
  host=$(hostname)
  cat > "$sd/slurm.conf" <<CONF
ClusterName=fsdp2test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sd/munge.sock
CredType=cred/munge
StateSaveLocation=$sd/state
SlurmdSpoolDir=$sd/spool
SlurmctldPidFile=$sd/slurmctld.pid
SlurmdPidFile=$sd/slurmd.pid
SlurmctldPort=$port
SlurmdPort=$(( port + 1 ))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile=$sd/slurmctld.log
SlurmdLogFile=$sd/slurmd.log
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=fsdp2 Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
  export SLURM_CONF="$sd/slurm.conf"
  slurmctld -c && slurmd || { skip "srun: slurmctld/slurmd do not start: $(tail -3 "$sd"/slurm*.log)"; return 1; }
  local i
  for i in $(seq 60); do
    sinfo -h -o %t 2>/dev/null | grep -q idle && return 0
    sleep 0.5
  done
  skip "srun: the node never became idle: $(sinfo 2>&1 | tail -2); $(tail -3 "$sd/slurmctld.log")"
  return 1
}
stop_slurm() {
  [[ -n "${sd:-}" ]] || return 0
  for p in slurmd slurmctld munged; do
    [[ -f "$sd/$p.pid" ]] && kill "$(cat "$sd/$p.pid")" 2>/dev/null
  done
  sleep 1
  rm -rf "$sd"
}
trap stop_slurm EXIT
if start_slurm; then
  out=$(timeout 300 srun -N 1 -n 4 --overcommit "$train" --batch-size 2 "${common[@]}" \
        --out-dir "$tmp/srun" 2>&1)
  if [[ $? -ne 0 ]]; then echo "FAIL: srun -n 4:"; echo "$out"; fail=1; else check "srun -n 4" "$out" 4; fi
fi

if [[ $fail -ne 0 ]]; then exit 1; fi
echo "launchers_test: all checks passed$([[ $skipped -ne 0 ]] && echo ' (some skipped, see above)')"
