package org.fsdp2;

import java.util.ArrayList;
import java.util.List;
import org.fsdp2.internal.Fsdp2Native;

/** Running a Java program as several local ranks. */
public final class Launcher {
  private Launcher() {}

  /** True in a process started as one rank (RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK set). */
  public static boolean isRankProcess() {
    Native.init();
    int[] isRank = new int[1];
    Fsdp2Native.fsdp2_is_rank_process(isRank);
    return isRank[0] != 0;
  }

  /**
   * The memory allocator this process runs with: "tcmalloc", "jemalloc" or
   * "system". Ranks started by {@link #launchLocal} run with tcmalloc unless
   * FSDP2_ALLOCATOR says otherwise.
   */
  public static String allocator() {
    Native.init();
    return Fsdp2Native.fsdp2_allocator();
  }

  /**
   * Runs this JVM's command line again as {@code nproc} local ranks and
   * waits; returns 0 when every rank succeeded, else the first failing
   * rank's exit code.
   */
  public static int launchLocal(int nproc) {
    return launchLocal(nproc, 0);
  }

  /**
   * {@link #launchLocal(int)} with restarts: when a rank dies, all ranks are
   * stopped and started again, up to {@code maxRestarts} times; a rank whose
   * {@link #restartCount()} is positive resumes from its newest checkpoint.
   */
  public static int launchLocal(int nproc, int maxRestarts) {
    Native.init();
    ProcessHandle.Info info = ProcessHandle.current().info();
    List<String> argv = new ArrayList<>();
    argv.add(info.command().orElseThrow(
        () -> new IllegalStateException("cannot read this JVM's command line")));
    for (String a : info.arguments().orElse(new String[0])) argv.add(a);
    int[] code = new int[1];
    Fsdp2Native.fsdp2_launch_local_with_restarts(nproc, 0, maxRestarts,
        argv.toArray(new String[0]), code);
    return code[0];
  }

  /** Which run of a job launched with restarts this rank is in (0: first). */
  public static int restartCount() {
    Native.init();
    int[] count = new int[1];
    Fsdp2Native.fsdp2_restart_count(count);
    return count[0];
  }
}
