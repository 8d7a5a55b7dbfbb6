package org.fsdp2;

import java.io.PrintWriter;
import java.util.Map;

/**
 * One rank of the multi-JVM test: trains the GPT on this rank's rows of a
 * fixed sequence of global batches and writes (rank 0) the losses and the
 * full token embedding. Usage: TrainWorker OUT STEPS [deferred] [ac=MODE]
 * [dropout=P] [memory] [acmemory] [unshard]. With memory, every rank also writes its
 * memory statistics after the steps to OUT.memory.RANK: "sharded total
 * optimizer grads peakUnsharded rss peakRss" (bytes). With acmemory (one
 * rank), it trains another GPT instead, one whose activations outweigh the
 * rest (8 blocks, 16 rows of 128 tokens), for two steps, and writes to OUT
 * how much the second grew the resident memory (its peak after the step
 * less its size before), with activation checkpointing ac=MODE. With
 * unshard, each step is preceded by an explicit all-gather of blocks.1
 * (asynchronous, awaited) and of the root, freed again before odd steps.
 */
public final class TrainWorker {
  static final int VOCAB = 32, BLOCK = 8, ROWS = 12;

  /** A learnable global batch: each row counts up in steps of 3 from a start. */
  static long[][] globalBatch(int step) {
    long[] tokens = new long[ROWS * BLOCK], targets = new long[ROWS * BLOCK];
    for (int r = 0; r < ROWS; ++r) {
      long start = Math.floorMod((long) (step * 7919 + r * 104729) * 2654435761L >>> 7, VOCAB);
      for (int c = 0; c < BLOCK; ++c) {
        tokens[r * BLOCK + c] = (start + 3L * c) % VOCAB;
        targets[r * BLOCK + c] = (start + 3L * (c + 1)) % VOCAB;
      }
    }
    return new long[][] {tokens, targets};
  }

  static Tensor[] localBatch(FSDP2Strategy s, int step) {
    long[][] g = globalBatch(step);
    int n = ROWS / s.dataParallelSize(), first = s.dataParallelRank() * n;
    long[] t = new long[n * BLOCK], y = new long[n * BLOCK];
    System.arraycopy(g[0], first * BLOCK, t, 0, n * BLOCK);
    System.arraycopy(g[1], first * BLOCK, y, 0, n * BLOCK);
    return new Tensor[] {Tensor.ofLongs(t, n, BLOCK), Tensor.ofLongs(y, n, BLOCK)};
  }

  static FSDP2Strategy newStrategy(boolean deferred, String ac, double dropout) {
    FSDP2Strategy s = FSDP2Strategy.builder().precision("fp32").seed(11)
        .activationCheckpointing(ac).build();
    s.setupEnvironment();
    // Two JVMs that each formed a world of one would train exactly like the
    // one-rank run: make sure this one joined the world it was started in.
    String rank = System.getenv("RANK"), world = System.getenv("WORLD_SIZE");
    if (s.rank() != Integer.parseInt(rank) || s.worldSize() != Integer.parseInt(world)
        || s.dataParallelSize() != s.worldSize()) {
      throw new IllegalStateException("started as rank " + rank + " of " + world + ", joined as "
          + s.rank() + " of " + s.worldSize() + " (data-parallel size " + s.dataParallelSize()
          + ")");
    }
    Model m;
    FSDP2Strategy.InitContext context = deferred ? s.tensorInitContext() : null;
    try {
      m = Model.gpt(Map.of("vocab_size", VOCAB, "block_size", BLOCK, "n_layer", 2,
          "n_head", 2, "n_embd", 16, "dropout", dropout));
    } finally {
      if (context != null) context.close();
    }
    try (Model model = m) {
      s.connect(model, OptimizerOptions.adamw().lr(0.01));
    }
    s.parallelize();
    return s;
  }

  static void acMemory(String out, String ac) throws Exception {
    try (FSDP2Strategy s = FSDP2Strategy.builder().precision("fp32").seed(11)
        .activationCheckpointing(ac).build()) {
      s.setupEnvironment();
      try (Model model = Model.gpt(Map.of("vocab_size", VOCAB, "block_size", 128, "n_layer", 8,
          "n_head", 4, "n_embd", 32))) {
        s.connect(model, OptimizerOptions.adamw().lr(0.01));
      }
      s.parallelize();
      long[] tokens = new long[16 * 128], targets = new long[16 * 128];
      for (int i = 0; i < tokens.length; ++i) {
        tokens[i] = (i * 7L) % VOCAB;
        targets[i] = (tokens[i] + 1) % VOCAB;
      }
      s.trainingStep(0, Tensor.ofLongs(tokens, 16, 128), Tensor.ofLongs(targets, 16, 128));
      s.resetPeakMemoryStats();
      MemoryStats before = s.memoryStats();
      s.trainingStep(1, Tensor.ofLongs(tokens, 16, 128), Tensor.ofLongs(targets, 16, 128));
      MemoryStats after = s.memoryStats();
      try (PrintWriter w = new PrintWriter(out)) {
        w.println(after.peakRssBytes - before.rssBytes);
      }
    }
  }

  /** Gathers blocks.1 and the root ahead of step {@code step}; frees them before odd steps. */
  static void unshardAhead(FSDP2Strategy s, int step) {
    long before = s.memoryStats().unshardedParamBytes;
    try (UnshardHandle gather = s.unshard("blocks.1", true)) {
      gather.await();
    }
    s.unshard("", false).close();
    long gathered = s.memoryStats().unshardedParamBytes;
    if (s.worldSize() > 1 && gathered <= before) {
      throw new IllegalStateException("unshard gathered nothing: " + before + " -> " + gathered);
    }
    if (step % 2 == 1) {
      s.reshard("blocks.1");
      s.reshard("");
      long after = s.memoryStats().unshardedParamBytes;
      if (after != before) throw new IllegalStateException("reshard left " + after + " bytes");
    }
  }

  public static void main(String[] args) throws Exception {
    int steps = Integer.parseInt(args[1]);
    boolean deferred = false;
    String ac = "none";
    double dropout = 0;
    boolean memory = false, acMemory = false;
    boolean unshard = false;
    for (int i = 2; i < args.length; ++i) {
      if (args[i].equals("deferred")) {
        deferred = true;
      } else if (args[i].equals("unshard")) {
        unshard = true;
      } else if (args[i].equals("memory")) {
        memory = true;
      } else if (args[i].equals("acmemory")) {
        acMemory = true;
      } else if (args[i].startsWith("ac=")) {
        ac = args[i].substring(3);
      } else if (args[i].startsWith("dropout=")) {
        dropout = Double.parseDouble(args[i].substring(8));
      } else {
        throw new IllegalArgumentException("unknown argument " + args[i]);
      }
    }
    if (acMemory) {
      acMemory(args[0], ac);
      return;
    }
    try (FSDP2Strategy s = newStrategy(deferred, ac, dropout)) {
      double[] losses = new double[steps];
      for (int i = 0; i < steps; ++i) {
        if (unshard) unshardAhead(s, i);
        losses[i] = s.trainingStep(i, 2, 0.5, localBatch(s, i)).loss;
      }
      if (memory) {
        MemoryStats m = s.memoryStats();
        try (PrintWriter out = new PrintWriter(args[0] + ".memory." + s.rank())) {
          out.println(m.shardedParamBytes + " " + m.totalParamBytes + " " + m.optimizerStateBytes
              + " " + m.shardedGradBytes + " " + m.peakUnshardedParamBytes + " " + m.rssBytes
              + " " + m.peakRssBytes);
        }
      }
      float[] wte = s.getParameter("wte.weight").toFloatArray();  // collective
      if (s.rank() == 0) {
        try (PrintWriter out = new PrintWriter(args[0])) {
          for (double l : losses) out.println("loss " + l);
          for (float w : wte) out.println(w);
        }
      }
    }
  }
}
