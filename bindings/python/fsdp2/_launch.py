"""Launching ranks: this program again as local ranks, or as a rank of an
outside launcher."""

import sys

from . import fsdp2_c as _c


def is_rank_process():
    """True in a process started as one rank (RANK, SLURM_PROCID or
    OMPI_COMM_WORLD_RANK set)."""
    return bool(_c.fsdp2_is_rank_process())


def launch_local(nproc, argv=None, threads_per_rank=0, max_restarts=0):
    """Runs this Python program again as `nproc` local ranks and waits;
    returns the exit code (0 when every rank succeeded). `argv`: the script
    and its arguments (default: sys.argv). With max_restarts N, when a rank
    dies all ranks are stopped and started again, up to N times: a rank
    whose restart_count() is positive resumes from its newest checkpoint."""
    args = [sys.executable] + list(sys.argv if argv is None else argv)
    return _c.fsdp2_launch_local_with_restarts(int(nproc), int(threads_per_rank),
                                               int(max_restarts), args)


def restart_with_rank_environment(argv=None):
    """For a rank an outside launcher (torchrun, srun, mpirun) started: the
    allocator is read when a process loads it, so when this process lacks
    what launch_local gives its ranks (tcmalloc through LD_PRELOAD,
    OMP_WAIT_POLICY=PASSIVE), runs this program again in its place with them,
    once, and does not return; otherwise returns. Call it first thing: what
    ran before runs twice. `argv`: the whole command line (default
    sys.orig_argv, the interpreter's own arguments included)."""
    args = list(sys.orig_argv if argv is None else argv)
    sys.stdout.flush()
    sys.stderr.flush()
    _c.fsdp2_restart_with_rank_environment(args)


def restart_count():
    """Which run of a job launched with restarts this rank is in (0: first)."""
    return _c.fsdp2_restart_count()
