package org.fsdp2;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.fsdp2.internal.Fsdp2Native;
import org.junit.jupiter.api.Test;

/**
 * The Java bindings: errors carry the C message, handles are AutoCloseable,
 * data crosses in direct buffers, and two JVMs train like one.
 */
class FSDP2StrategyTest {
  private static void expect(int status, String text, Runnable call) {
    FSDP2Exception e = assertThrows(FSDP2Exception.class, call::run);
    assertEquals(status, e.status(), e.getMessage());
    assertTrue(e.getMessage().contains(text), e.getMessage() + " lacks " + text);
  }

  @Test
  void badOptionsThrowWithTheCMessage() {
    expect(Status.INVALID_ARGUMENT, "unknown option \"data_paralel_size\"",
        () -> FSDP2Strategy.builder().set("data_paralel_size", 2).build());
    expect(Status.INVALID_ARGUMENT, "full_shard",
        () -> FSDP2Strategy.builder().shardingStrategy("zero3").build());
    expect(Status.INVALID_ARGUMENT, "\"data_parallel_size\" must be \"auto\" or a positive integer",
        () -> FSDP2Strategy.builder().dataParallelSize("two").build());
    expect(Status.INVALID_ARGUMENT, "nccl",
        () -> FSDP2Strategy.builder().backend("mpi").build());
    // Every typed setter names an option the library knows.
    FSDP2Strategy.builder().dataParallelSize("auto").tensorParallelSize(1)
        .shardingStrategy("hybrid_shard").shardGroupSize(1).reshardAfterForward(false)
        .precision("fp32").cpuOffload(false).backend("gloo").timeoutMs(60000)
        .checkpointFormat("full").seed(3).shuffle(false).dropLast(false)
        .activationCheckpointing("selective").acEvery(2).build().close();
    FSDP2Strategy.builder().activationCheckpointing(true).build().close();
    FSDP2Strategy.builder().prefetch(0, 2).gradientAccumulation("sharded")
        .gradientDivideFactor(1.0).build().close();
    FSDP2Strategy.builder().ignoredParams(true, "wpe.weight", "blocks.*.bias")
        .forwardPrefetchModules("", "blocks.1", "blocks.0").forwardPrefetchModules("blocks.0")
        .backwardPrefetchModules("blocks.1", "blocks.0").build().close();
    expect(Status.INVALID_ARGUMENT, "contains one of",
        () -> FSDP2Strategy.builder().ignoredParams(false, "a,b").build());
    expect(Status.INVALID_ARGUMENT, "given twice",
        () -> FSDP2Strategy.builder().forwardPrefetchModules("a", "b")
            .forwardPrefetchModules("a", "c").build());
    expect(Status.INVALID_ARGUMENT, "local, sharded",
        () -> FSDP2Strategy.builder().gradientAccumulation("never").build());
    expect(Status.INVALID_ARGUMENT, "forward_prefetch and backward_prefetch",
        () -> FSDP2Strategy.builder().prefetch(-1, 1).build());
    expect(Status.INVALID_ARGUMENT, "none, full, selective",
        () -> FSDP2Strategy.builder().activationCheckpointing("sometimes").build());
    expect(Status.INVALID_ARGUMENT, "ac_every must be at least 1",
        () -> FSDP2Strategy.builder().activationCheckpointing("selective").acEvery(0).build());
    expect(Status.INVALID_ARGUMENT, "unknown model family",
        () -> Model.fromConfig("{\"family\": \"rnn\"}"));
    expect(Status.INVALID_ARGUMENT, "not valid JSON", () -> Model.fromConfig("{\"family\""));
    expect(Status.IO, "does not exist", () -> Model.fromTorchScript("/nonexistent.pt", "mse"));
  }

  @Test
  void closedHandlesThrow() {
    Model m = Model.mlp(Map.of("in_features", 3, "hidden", 4, "out_features", 2, "depth", 1));
    assertArrayEquals(new long[] {10, 110}, m.numParameters());
    m.close();
    m.close();  // twice is fine
    assertTrue(m.isClosed());
    expect(Status.INVALID_HANDLE, "closed", m::numParameters);
  }

  /**
   * What the bindings themselves refuse (more than FSDP2_MAX_DIMS dimensions,
   * a null batch tensor, an out-array with no room) throws a Java exception
   * saying so, after an earlier failed call left a message in
   * fsdp2_last_error(): never an FSDP2Exception, whose message would be that
   * stale one.
   */
  @Test
  void whatTheBindingsRefuseThrowsJavaExceptions() {
    expect(Status.INVALID_ARGUMENT, "not valid JSON", () -> Model.fromConfig("{"));
    IllegalArgumentException dims = assertThrows(IllegalArgumentException.class,
        () -> Tensor.zeros(Tensor.FLOAT32, 1, 1, 1, 1, 1, 1, 1, 1, 1));
    assertTrue(dims.getMessage().contains("at most 8 dimensions"), dims.getMessage());
    // 2^64 elements: a wrapped element count would make an empty buffer look right.
    IllegalArgumentException huge = assertThrows(IllegalArgumentException.class,
        () -> new Tensor(ByteBuffer.allocateDirect(0), Tensor.UINT8, 1L << 32, 1L << 32));
    assertTrue(huge.getMessage().contains("too large"), huge.getMessage());
    try (FSDP2Strategy s = FSDP2Strategy.builder().build()) {
      Tensor t = Tensor.zeros(Tensor.INT64, 2, 4);
      NullPointerException batch = assertThrows(NullPointerException.class,
          () -> s.trainingStep(0, t, null));
      assertEquals("batch[1] is null", batch.getMessage());
      IllegalArgumentException room = assertThrows(IllegalArgumentException.class,
          () -> Fsdp2Native.fsdp2_strategy_num_parameters(s.nativeHandle(), new long[0]));
      assertTrue(room.getMessage().contains("count: the out-array needs at least 1"),
          room.getMessage());
      IllegalArgumentException description = assertThrows(IllegalArgumentException.class,
          () -> Fsdp2Native.fsdp2_strategy_predict_shape(s.nativeHandle(), new Tensor[] {t},
              new long[2]));
      assertTrue(description.getMessage().contains("at least 10"), description.getMessage());
      NullPointerException argv = assertThrows(NullPointerException.class,
          () -> Fsdp2Native.fsdp2_launch_local(1, 0, new String[] {"java", null}, new int[1]));
      assertEquals("argv[1] is null", argv.getMessage());
    }
  }

  /** One strategy in this JVM (a world of one, through FSDP2_STORE_PATH). */
  @Test
  void trainingOrderArraysAndState() {
    long[][] g = TrainWorker.globalBatch(0);
    Tensor tokens = Tensor.ofLongs(g[0], TrainWorker.ROWS, TrainWorker.BLOCK);
    Tensor targets = Tensor.ofLongs(g[1], TrainWorker.ROWS, TrainWorker.BLOCK);
    FSDP2Strategy s = FSDP2Strategy.builder().precision("fp32").device("cpu").build();
    expect(Status.WRONG_ORDER, "setup_environment", s::parallelize);
    s.setupEnvironment();
    expect(Status.WRONG_ORDER, "parallelize", () -> s.trainingStep(0, tokens, targets));
    try (Model m = Model.gpt(Map.of("vocab_size", 32, "block_size", 8, "n_layer", 2,
        "n_head", 2, "n_embd", 16))) {
      s.connect(m, OptimizerOptions.adamw().lr(0.01));
    }
    expect(Status.WRONG_ORDER, "parallelize", s::memoryStats);
    expect(Status.WRONG_ORDER, "parallelize", s::resetPeakMemoryStats);
    s.parallelize();
    MemoryStats built = s.memoryStats();
    assertEquals(0, built.optimizerStateBytes);
    assertEquals(built.totalParamBytes, built.shardedParamBytes, "one rank holds everything");

    Tensor floats = Tensor.zeros(Tensor.FLOAT32, TrainWorker.ROWS, TrainWorker.BLOCK);
    expect(Status.SHAPE, "integer tensor", () -> s.trainingStep(0, floats, targets));
    expect(Status.SHAPE, "micro-batches", () -> s.trainingStep(0, 5, 0.0, tokens, targets));
    // A batch has no size limit of its own: 17 tensors reach the library,
    // which refuses them with its own message, not the last failure's.
    Tensor[] many = new Tensor[17];
    for (int i = 0; i < many.length; ++i) many[i] = Tensor.zeros(Tensor.FLOAT32, 1);
    expect(Status.SHAPE, "tokens must be a 2-D integer tensor", () -> s.trainingStep(0, many));
    StepResult r = s.trainingStep(0, tokens, targets);
    assertTrue(r.loss > 0 && r.loss < 10 && r.step == 1, "loss " + r.loss);
    assertTrue(s.validationStep(0, tokens, targets) > 0);
    Tensor logits = s.predictStep(0, tokens);
    assertArrayEquals(new long[] {TrainWorker.ROWS, TrainWorker.BLOCK, 32}, logits.shape());
    MemoryStats trained = s.memoryStats();
    assertEquals(2 * trained.shardedParamBytes, trained.optimizerStateBytes, "AdamW: " + trained);
    assertEquals(trained.totalParamBytes, trained.toMap().get("total_param_bytes"));
    assertEquals(13, trained.toMap().size());
    assertEquals(0L, (long) trained.toMap().get("peak_device_allocated_bytes"));  // on the CPU
    assertTrue(trained.peakRssBytes >= trained.rssBytes && trained.rssBytes > 0, "" + trained);
    s.resetPeakMemoryStats();

    List<String> names = s.parameterNames();
    assertEquals("wte.weight", names.get(0));
    Tensor wpe = s.getParameter("wpe.weight");
    assertArrayEquals(new long[] {8, 16}, wpe.shape());
    float[] values = new float[8 * 16];
    for (int i = 0; i < values.length; ++i) values[i] = i / 100f;
    s.setParameter("wpe.weight", Tensor.ofFloats(values, 8, 16));
    assertArrayEquals(values, s.getParameter("wpe.weight").toFloatArray());
    expect(Status.SHAPE, "dtype",
        () -> s.setParameter("wpe.weight", Tensor.zeros(Tensor.FLOAT64, 8, 16)));
    expect(Status.INVALID_ARGUMENT, "no parameter named", () -> s.getParameter("wpe.bias"));

    // A state dict saved as safetensors (as a PyTorch state_dict() is by
    // core/checkpoint/load_safetensors.py) loads by name from its file.
    Map<String, Tensor> fileState = s.lightningModuleStateDict();
    float[] shifted = new float[8 * 16];
    for (int i = 0; i < shifted.length; ++i) shifted[i] = 1 - i / 50f;
    fileState.put("wpe.weight", Tensor.ofFloats(shifted, 8, 16));
    Path stateFile = Path.of(System.getProperty("java.io.tmpdir"), "junit_state.safetensors");
    writeSafetensors(stateFile, fileState);
    s.loadModelStateDict(stateFile.toString());
    assertArrayEquals(shifted, s.getParameter("wpe.weight").toFloatArray());
    expect(Status.IO, "junit_missing.safetensors",
        () -> s.loadModelStateDict(stateFile.resolveSibling("junit_missing.safetensors").toString()));

    // State round trip: the model and optimizer state taken after step 1 and
    // restored after step 2 make step 2 repeat bit for bit (same loss, same
    // parameters after it: AdamW's moments and step count came back too).
    Map<String, Tensor> model = s.lightningModuleStateDict();
    byte[] state = s.optimizerStateDict();
    assertTrue(state.length > 100);
    long[][] g1 = TrainWorker.globalBatch(1);
    Tensor tokens1 = Tensor.ofLongs(g1[0], TrainWorker.ROWS, TrainWorker.BLOCK);
    Tensor targets1 = Tensor.ofLongs(g1[1], TrainWorker.ROWS, TrainWorker.BLOCK);
    StepResult second = s.trainingStep(1, tokens1, targets1);
    Map<String, Tensor> afterSecond = s.lightningModuleStateDict();
    s.loadModelStateDict(model);
    s.loadOptimizerStateDict(state);
    assertTrue(s.hasPendingOptimizerState());
    StepResult again = s.trainingStep(1, tokens1, targets1);
    assertFalse(s.hasPendingOptimizerState());
    assertEquals(second.loss, again.loss, 0.0, "step 2 after restoring the state");
    assertEquals(model.keySet(), afterSecond.keySet());
    for (String name : names) {
      assertArrayEquals(afterSecond.get(name).toFloatArray(), s.getParameter(name).toFloatArray(),
          name + " after step 2 repeated");
    }
    assertArrayEquals(new long[] {0, 3}, s.currentEpochStep());
    expect(Status.IO, "/nonexistent/ckpt", () -> s.loadCheckpoint("/nonexistent/ckpt"));

    // Checkpoint round trip: parameters and counters come back; remove deletes it.
    String ckpt = Path.of(System.getProperty("java.io.tmpdir"), "junit_ckpt").toString();
    s.saveCheckpoint(ckpt);
    float[] saved = s.getParameter("wte.weight").toFloatArray();
    s.trainingStep(3, tokens, targets);
    assertFalse(Arrays.equals(saved, s.getParameter("wte.weight").toFloatArray()));
    s.loadCheckpoint(ckpt);
    assertArrayEquals(saved, s.getParameter("wte.weight").toFloatArray());
    assertArrayEquals(new long[] {0, 3}, s.currentEpochStep());
    // A background save: written while the caller goes on, then loadable.
    s.saveCheckpoint(ckpt, true);
    s.waitForCheckpoint();
    assertFalse(s.checkpointInFlight());
    s.loadCheckpoint(ckpt);
    assertArrayEquals(saved, s.getParameter("wte.weight").toFloatArray());
    s.removeCheckpoint(ckpt);
    assertFalse(Files.exists(Path.of(ckpt)), ckpt + " still exists");
    expect(Status.IO, "not an fsdp2 checkpoint",
        () -> s.removeCheckpoint(System.getProperty("java.io.tmpdir")));

    // teardown() drops the optimizer: training refuses, evaluation still works.
    double before = s.validationStep(0, tokens, targets);
    s.teardown();
    expect(Status.WRONG_ORDER, "torn down", () -> s.trainingStep(2, tokens, targets));
    expect(Status.WRONG_ORDER, "torn down", s::optimizerStateDict);
    assertEquals(before, s.validationStep(0, tokens, targets), 0.0);
    s.close();
    expect(Status.INVALID_HANDLE, "closed", () -> s.trainingStep(0, tokens, targets));
  }

  /** Float32 tensors as a safetensors file: header length, JSON header, data. */
  private static void writeSafetensors(Path path, Map<String, Tensor> tensors) {
    StringBuilder header = new StringBuilder("{");
    List<float[]> data = new ArrayList<>();
    long offset = 0;
    for (Map.Entry<String, Tensor> e : tensors.entrySet()) {
      float[] v = e.getValue().toFloatArray();
      if (header.length() > 1) header.append(',');
      header.append('"').append(e.getKey()).append("\":{\"dtype\":\"F32\",\"shape\":")
          .append(Arrays.toString(e.getValue().shape()).replace(" ", ""))
          .append(",\"data_offsets\":[").append(offset).append(',')
          .append(offset + 4L * v.length).append("]}");
      offset += 4L * v.length;
      data.add(v);
    }
    byte[] h = header.append('}').toString().getBytes(StandardCharsets.UTF_8);
    ByteBuffer b = ByteBuffer.allocate(8 + h.length + (int) offset).order(ByteOrder.LITTLE_ENDIAN);
    b.putLong(h.length).put(h);
    for (float[] v : data) for (float x : v) b.putFloat(x);
    try {
      Files.write(path, b.array());
    } catch (java.io.IOException e) {
      throw new RuntimeException(e);
    }
  }

  private static List<String> runRanks(int world, Path out, int steps, String... extra)
      throws Exception {
    Path store = Files.createTempFile(out.getParent(), "store", "");
    Files.delete(store);
    List<Process> procs = new ArrayList<>();
    for (int r = 0; r < world; ++r) {
      ProcessBuilder pb = new ProcessBuilder(
          ProcessHandle.current().info().command().orElse("java"),
          "-Dfsdp2.jni=" + System.getProperty("fsdp2.jni"),
          "-cp", System.getProperty("fsdp2.classpath"), "org.fsdp2.TrainWorker",
          out.toString(), Integer.toString(steps));
      pb.command().addAll(List.of(extra));
      pb.environment().put("RANK", Integer.toString(r));
      pb.environment().put("WORLD_SIZE", Integer.toString(world));
      pb.environment().put("FSDP2_STORE_PATH", store.toString());
      pb.environment().put("OMP_NUM_THREADS", "1");
      if (List.of(extra).contains("acmemory")) {
        // Freed tensors leave resident memory at once (glibc's adaptive
        // mmap threshold would keep them in its heap).
        pb.environment().put("MALLOC_MMAP_THRESHOLD_", "65536");
      }
      pb.redirectErrorStream(true);
      pb.redirectOutput(new File(out + ".rank" + r + ".log"));
      procs.add(pb.start());
    }
    try {
      for (int r = 0; r < world; ++r) {
        Process p = procs.get(r);
        if (!p.waitFor(240, TimeUnit.SECONDS)) throw new AssertionError(world + " JVMs timed out");
        assertEquals(0, p.exitValue(), "rank " + r + " of " + world + ": "
            + Files.readString(Path.of(out + ".rank" + r + ".log")));
      }
    } finally {
      // A failed rank leaves the others waiting in a collective: stop them.
      for (Process q : procs) q.destroyForcibly();
    }
    return Files.readAllLines(out);
  }

  @Test
  void activationCheckpointingChangesNothing() throws Exception {
    Path dir = Files.createTempDirectory(Path.of(System.getProperty("java.io.tmpdir")), "ac");
    for (int world : new int[] {1, 2}) {
      List<String> plain = runRanks(world, dir.resolve("plain" + world + ".txt"), 3,
          "ac=none", "dropout=0.1");
      List<String> ac = runRanks(world, dir.resolve("ac" + world + ".txt"), 3,
          "ac=full", "dropout=0.1");
      assertTrue(plain.size() > 3, "values: " + plain.size());
      // Recomputation with the dropout masks replayed: bit for bit.
      assertEquals(plain, ac, world + " JVMs");
    }
    List<String> noDropout = runRanks(1, dir.resolve("nodrop.txt"), 3, "ac=none", "dropout=0");
    assertNotEquals(noDropout, runRanks(1, dir.resolve("plain1b.txt"), 3, "dropout=0.1"),
        "dropout had no effect");
  }

  /**
   * Equal losses would hold were the option ignored: with every block
   * checkpointed, a step's resident memory grows by well under half of what
   * it grows without (every block's activations alive at the end of forward,
   * against their inputs and one block's recomputation; measured: about 4x
   * less).
   */
  @Test
  void activationCheckpointingLowersThePeak() throws Exception {
    Path dir = Files.createTempDirectory(Path.of(System.getProperty("java.io.tmpdir")), "acmem");
    long none = Long.parseLong(
        runRanks(1, dir.resolve("none.txt"), 1, "acmemory", "ac=none").get(0).trim());
    long full = Long.parseLong(
        runRanks(1, dir.resolve("full.txt"), 1, "acmemory", "ac=full").get(0).trim());
    System.out.printf("a step grows the resident memory by %.1f MiB without activation "
        + "checkpointing, %.1f MiB with%n", none / 1048576.0, full / 1048576.0);
    assertTrue(none > (32L << 20), "without checkpointing a step grows by " + none + " bytes");
    assertTrue(full < none / 2, "activation checkpointing did not lower the peak: " + full
        + " bytes with, " + none + " without");
  }

  /**
   * Explicit unshard and reshard in this JVM (a world of one, bf16: an
   * unsharded module holds a bf16 copy): the gathered copy shows in the
   * memory statistics and reshard frees it; handles are AutoCloseable, and
   * bad names and closed handles throw.
   */
  @Test
  void unshardAndReshardByName() {
    try (FSDP2Strategy s = FSDP2Strategy.builder().precision("bf16").device("cpu").build()) {
      s.setupEnvironment();
      expect(Status.WRONG_ORDER, "parallelize", () -> s.unshard("blocks.0", true));
      try (Model m = Model.gpt(Map.of("vocab_size", 32, "block_size", 8, "n_layer", 2,
          "n_head", 2, "n_embd", 16))) {
        s.connect(m, OptimizerOptions.adamw());
      }
      s.parallelize();
      assertEquals(0, s.memoryStats().unshardedParamBytes);
      UnshardHandle gather = s.unshard("blocks.0", true);
      gather.await();
      gather.await();  // once; a second wait returns at once
      assertTrue(s.memoryStats().unshardedParamBytes > 0, "blocks.0 was not unsharded");
      s.reshard("blocks.0");
      assertEquals(0, s.memoryStats().unshardedParamBytes, "reshard freed nothing");
      gather.close();
      gather.close();  // twice is fine
      expect(Status.INVALID_HANDLE, "closed", gather::await);
      s.unshard("", false).close();
      assertTrue(s.memoryStats().unshardedParamBytes > 0, "the root was not unsharded");
      s.reshard("");
      expect(Status.INVALID_ARGUMENT, "'blocks.5', which is not a module of the model",
          () -> s.unshard("blocks.5", false));
      expect(Status.INVALID_ARGUMENT, "'blocks.0.attn', which is not a sharded module",
          () -> s.reshard("blocks.0.attn"));
    }
  }

  /** Memory statistics on 1 and 2 JVMs: the shards add up to the model (FULL_SHARD). */
  @Test
  void memoryStatsOfOneAndTwoJvms() throws Exception {
    Path dir = Files.createTempDirectory(Path.of(System.getProperty("java.io.tmpdir")), "mem");
    for (int world : new int[] {1, 2}) {
      Path out = dir.resolve("memory" + world + ".txt");
      runRanks(world, out, 2, "memory");
      long sharded = 0, total = -1;
      for (int r = 0; r < world; ++r) {
        String[] v = Files.readString(Path.of(out + ".memory." + r)).trim().split(" ");
        long rankSharded = Long.parseLong(v[0]), rankTotal = Long.parseLong(v[1]);
        long optimizer = Long.parseLong(v[2]), grads = Long.parseLong(v[3]);
        long peakUnsharded = Long.parseLong(v[4]), rss = Long.parseLong(v[5]);
        long peakRss = Long.parseLong(v[6]);
        assertTrue(total < 0 || total == rankTotal, "ranks disagree on the total");
        total = rankTotal;
        sharded += rankSharded;
        assertEquals(2 * rankSharded, optimizer, "AdamW state on rank " + r);
        assertEquals(0, grads, "the step frees the shards' gradients (zero) on rank " + r);
        if (world == 1) {
          assertEquals(0, peakUnsharded, "one rank never gathers");
        } else {
          assertTrue(peakUnsharded > 0 && peakUnsharded <= rankTotal, "peak " + peakUnsharded);
          assertEquals(rankTotal / 2.0, rankSharded, 0.1 * rankTotal / 2, "about half");
        }
        assertTrue(peakRss >= rss && rss > 0, rss + " " + peakRss);
      }
      assertEquals(total, sharded, world + " JVMs: the shards add up to the model");
      // fp32 GPT of TrainWorker: 28928 bytes of parameters.
      assertEquals(28928, total);
    }
  }

  @Test
  void twoJvmsTrainLikeOne() throws Exception {
    Path dir = Files.createTempDirectory(Path.of(System.getProperty("java.io.tmpdir")), "jvms");
    List<String> one = runRanks(1, dir.resolve("one.txt"), 4);
    List<String> two = runRanks(2, dir.resolve("two.txt"), 4);
    // Built under tensorInitContext(): bit-identical to the eager build.
    List<String> deferred = runRanks(2, dir.resolve("deferred.txt"), 4, "deferred");
    assertEquals(two, deferred, "a deferred build trains differently from an eager one");
    // Gathering blocks ahead of the steps (and freeing them) changes nothing.
    List<String> unshard = runRanks(2, dir.resolve("unshard.txt"), 4, "unshard");
    assertEquals(two, unshard, "explicit unshard/reshard changed the training");
    assertEquals(one.size(), two.size());
    assertTrue(one.size() > 4 + 100, "values: " + one.size());
    double first = Double.parseDouble(one.get(0).substring(5));
    double last = Double.parseDouble(one.get(3).substring(5));
    assertTrue(last < first, "the loss did not fall: " + first + " -> " + last);
    for (int i = 0; i < one.size(); ++i) {
      boolean loss = one.get(i).startsWith("loss ");
      double a = Double.parseDouble(loss ? one.get(i).substring(5) : one.get(i));
      double b = Double.parseDouble(loss ? two.get(i).substring(5) : two.get(i));
      // fp32: losses to 1e-5 relative; parameters after 4 AdamW steps to 1e-4.
      double tolerance = loss ? 1e-5 * Math.abs(a) : 1e-4;
      assertEquals(a, b, tolerance, "value " + i + (loss ? " (loss)" : " (wte.weight)"));
    }
  }
}
