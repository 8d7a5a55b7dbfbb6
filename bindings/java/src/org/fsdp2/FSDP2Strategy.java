package org.fsdp2;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.fsdp2.internal.Fsdp2Native;

/**
 * NeMo/Lightning's FSDP2Strategy over fsdp2's C++ engine, from Java.
 *
 * <pre>{@code
 * try (FSDP2Strategy s = FSDP2Strategy.builder().precision("fp32").build()) {
 *   s.setupEnvironment();                       // torchrun/srun/mpirun or one process
 *   try (Model m = Model.fromConfig("{\"family\": \"gpt\"}")) {
 *     s.connect(m, OptimizerOptions.adamw().lr(3e-3));
 *   }
 *   s.parallelize();
 *   StepResult r = s.trainingStep(0, tokens, targets);
 *   s.saveCheckpoint("/tmp/ckpt");
 * }
 * }</pre>
 *
 * Every failure throws {@link FSDP2Exception} with the library's message.
 * Calls marked collective must be made by every rank. One strategy is used by
 * one thread at a time.
 */
public final class FSDP2Strategy extends Handle {
  /** Options by their C names (see fsdp2_strategy_options_t); unknown ones fail in build(). */
  public static final class Builder {
    private final Map<String, Object> options = new LinkedHashMap<>();

    /** Data-parallel ranks; the default is "auto" (what the tensor-parallel size leaves). */
    public Builder dataParallelSize(int size) {
      return set("data_parallel_size", size);
    }

    /** "auto": the library picks (see fsdp2_strategy_options_from_json). */
    public Builder dataParallelSize(String auto) {
      return set("data_parallel_size", auto);
    }

    public Builder tensorParallelSize(int size) {
      return set("tensor_parallel_size", size);
    }

    /** "auto": the library picks. */
    public Builder tensorParallelSize(String auto) {
      return set("tensor_parallel_size", auto);
    }

    /** full_shard, shard_grad_op, no_shard or hybrid_shard. */
    public Builder shardingStrategy(String strategy) {
      return set("sharding_strategy", strategy);
    }

    /** bf16 (the default) or fp32. */
    public Builder precision(String precision) {
      return set("precision", precision);
    }

    /** sharded (the default) or full. */
    public Builder checkpointFormat(String format) {
      return set("checkpoint_format", format);
    }

    public Builder seed(long seed) {
      return set("seed", seed);
    }

    public Builder timeoutMs(long timeoutMs) {
      return set("timeout_ms", timeoutMs);
    }

    /** Whether parameters are resharded after forward (the default depends on the strategy). */
    public Builder reshardAfterForward(boolean reshard) {
      return set("reshard_after_forward", reshard);
    }

    /** HYBRID_SHARD: ranks per sharding group (0: one node). */
    public Builder shardGroupSize(int ranks) {
      return set("shard_group_size", ranks);
    }

    public Builder cpuOffload(boolean offload) {
      return set("cpu_offload", offload);
    }

    /** gloo (the default) or nccl. */
    public Builder backend(String backend) {
      return set("backend", backend);
    }

    /** The token loaders' sampler: shuffle each epoch (the default). */
    public Builder shuffle(boolean shuffle) {
      return set("shuffle", shuffle);
    }

    /** Drop a last partial global batch (the default) instead of padding it. */
    public Builder dropLast(boolean dropLast) {
      return set("drop_last", dropLast);
    }

    /** Any option by its C name (a String, Number or Boolean); unknown names fail in build(). */
    public Builder set(String key, Object value) {
      options.put(key, value);
      return this;
    }

    public FSDP2Strategy build() {
      Native.init();
      long[] out = new long[1];
      Native.check(Fsdp2Native.fsdp2j_strategy_create(Native.jsonObject(options), out));
      return new FSDP2Strategy(out[0]);
    }
  }

  public static Builder builder() {
    return new Builder();
  }

  private FSDP2Strategy(long handle) {
    super(handle);
  }

  @Override
  void destroy(long handle) {
    Fsdp2Native.fsdp2j_strategy_destroy(handle);
  }

  /** Collective: joins the job, builds the (dp, tp) mesh, seeds every rank. */
  public void setupEnvironment() {
    Native.check(Fsdp2Native.fsdp2j_setup_environment(handle()));
  }

  private int[] rankInfo() {
    int[] v = new int[4];
    Native.check(Fsdp2Native.fsdp2j_rank_info(handle(), v));
    return v;
  }

  public int rank() {
    return rankInfo()[0];
  }

  public int worldSize() {
    return rankInfo()[1];
  }

  public int dataParallelRank() {
    return rankInfo()[2];
  }

  public int dataParallelSize() {
    return rankInfo()[3];
  }

  /** Lightning's tensor_init_context(); see {@link #tensorInitContext()}. */
  public static final class InitContext implements AutoCloseable {
    private final FSDP2Strategy previous;

    private InitContext(FSDP2Strategy strategy) {
      previous = Model.INIT_CONTEXT.get();
      Model.INIT_CONTEXT.set(strategy);
    }

    @Override
    public void close() {
      Model.INIT_CONTEXT.set(previous);
    }
  }

  /**
   * Models built on this thread until the context closes take no parameter
   * memory until parallelize(), which gives each rank only its rows, with
   * values bit-identical to an eager build. After setupEnvironment().
   */
  public InitContext tensorInitContext() {
    handle();
    return new InitContext(this);
  }

  long nativeHandle() {
    return handle();
  }

  /** Attaches the model (the strategy keeps its own reference) and the optimizer to build. */
  public void connect(Model model, OptimizerOptions optimizer) {
    String json = optimizer == null ? "{}" : optimizer.toJson();
    Native.check(Fsdp2Native.fsdp2j_connect(handle(), model.nativeHandle(), json));
  }

  /** Collective: shards the model (each block, then the root), builds the optimizer. */
  public void parallelize() {
    Native.check(Fsdp2Native.fsdp2j_parallelize(handle()));
  }

  /** Collective: one optimizer step on this rank's rows. */
  public StepResult trainingStep(long batchIdx, Tensor... batch) {
    return trainingStep(batchIdx, 1, 0.0, batch);
  }

  /** With gradient accumulation over equal micro-batches and global-norm clipping (0: off). */
  public StepResult trainingStep(long batchIdx, int accumulateGradBatches, double gradientClipVal,
      Tensor... batch) {
    double[] result = new double[3];
    try (Batch b = new Batch(batch)) {
      Native.check(Fsdp2Native.fsdp2j_training_step(handle(), b.handle, batchIdx,
          accumulateGradBatches, gradientClipVal, result));
    }
    return new StepResult(result);
  }

  /** Collective: the loss without gradients, averaged over data-parallel ranks. */
  public double validationStep(long batchIdx, Tensor... batch) {
    return evaluationStep(batchIdx, false, batch);
  }

  public double testStep(long batchIdx, Tensor... batch) {
    return evaluationStep(batchIdx, true, batch);
  }

  private double evaluationStep(long batchIdx, boolean test, Tensor... batch) {
    double[] loss = new double[1];
    try (Batch b = new Batch(batch)) {
      Native.check(Fsdp2Native.fsdp2j_evaluation_step(handle(), b.handle, batchIdx, test ? 1 : 0,
          loss));
    }
    return loss[0];
  }

  /** Collective: this rank's prediction, in a new tensor. */
  public Tensor predictStep(long batchIdx, Tensor... batch) {
    try (Batch b = new Batch(batch)) {
      long[] info = new long[2 + 8];
      Native.check(Fsdp2Native.fsdp2j_predict_shape(handle(), b.handle, info));
      Tensor out = Tensor.zeros((int) info[0], shapeOf(info));
      Native.check(Fsdp2Native.fsdp2j_predict_step(handle(), b.handle, batchIdx, out.buffer(),
          out.dtype(), out.shapeRef(), out.shapeRef().length));
      return out;
    }
  }

  private static long[] shapeOf(long[] info) {
    long[] shape = new long[(int) info[1]];
    System.arraycopy(info, 2, shape, 0, shape.length);
    return shape;
  }

  /** A loader over a token file: UINT8 (a text's bytes), UINT16 or INT32 tokens. */
  public TokenDataLoader tokenDataLoader(String path, int tokenDtype, long blockSize,
      long globalBatchSize, double beginFraction, double endFraction) {
    long[] out = new long[1];
    Native.check(Fsdp2Native.fsdp2j_token_loader_create(handle(), path, tokenDtype, blockSize,
        globalBatchSize, beginFraction, endFraction, out));
    return new TokenDataLoader(out[0]);
  }

  public StepResult trainingStep(TokenDataLoader loader, long batchIdx, double gradientClipVal) {
    double[] result = new double[3];
    Native.check(Fsdp2Native.fsdp2j_training_step_loader(handle(), loader.nativeHandle(), batchIdx,
        1, gradientClipVal, result));
    return new StepResult(result);
  }

  public double validationStep(TokenDataLoader loader, long batchIdx) {
    double[] loss = new double[1];
    Native.check(Fsdp2Native.fsdp2j_validation_step_loader(handle(), loader.nativeHandle(),
        batchIdx, loss));
    return loss[0];
  }

  /** Collective: model, optimizer and counters, written atomically. */
  public void saveCheckpoint(String path) {
    Native.check(Fsdp2Native.fsdp2j_save_checkpoint(handle(), path));
  }

  /** Collective: a checkpoint saved on any number of ranks. */
  public void loadCheckpoint(String path) {
    Native.check(Fsdp2Native.fsdp2j_load_checkpoint(handle(), path));
  }

  public void removeCheckpoint(String path) {
    Native.check(Fsdp2Native.fsdp2j_remove_checkpoint(handle(), path));
  }

  /** This rank's optimizer state (of its shards). */
  public byte[] optimizerStateDict() {
    long[] size = new long[1];
    Native.check(Fsdp2Native.fsdp2j_optimizer_state_dict(handle(), size));
    ByteBuffer buffer = ByteBuffer.allocateDirect((int) size[0]);
    Native.check(Fsdp2Native.fsdp2j_optimizer_state_copy(buffer, size[0]));
    byte[] bytes = new byte[(int) size[0]];
    buffer.get(bytes);
    return bytes;
  }

  /** Applied at the next training step, once (deferred restoration). */
  public void loadOptimizerStateDict(byte[] state) {
    ByteBuffer buffer = ByteBuffer.allocateDirect(state.length);
    buffer.put(state);
    Native.check(Fsdp2Native.fsdp2j_load_optimizer_state_dict(handle(), buffer, state.length));
  }

  public boolean hasPendingOptimizerState() {
    int[] pending = new int[1];
    Native.check(Fsdp2Native.fsdp2j_has_pending_optimizer_state(handle(), pending));
    return pending[0] != 0;
  }

  /** The parameters' names, in order. */
  public List<String> parameterNames() {
    long[] count = new long[1];
    Native.check(Fsdp2Native.fsdp2j_num_parameters(handle(), count));
    List<String> names = new ArrayList<>();
    int[] status = new int[1];
    for (long i = 0; i < count[0]; ++i) {
      String name = Fsdp2Native.fsdp2j_parameter_name(handle(), i, status);
      Native.check(status[0]);
      names.add(name);
    }
    return names;
  }

  /** Collective: the full value of one parameter. */
  public Tensor getParameter(String name) {
    int index = parameterNames().indexOf(name);
    long[] info = new long[2 + 8];
    if (index < 0) {
      // Let the library say what is wrong.
      Native.check(Fsdp2Native.fsdp2j_get_parameter(handle(), name, ByteBuffer.allocateDirect(0),
          Tensor.FLOAT32, new long[] {0}, 1));
    }
    Native.check(Fsdp2Native.fsdp2j_parameter_shape(handle(), index, info));
    Tensor out = Tensor.zeros((int) info[0], shapeOf(info));
    Native.check(Fsdp2Native.fsdp2j_get_parameter(handle(), name, out.buffer(), out.dtype(),
        out.shapeRef(), out.shapeRef().length));
    return out;
  }

  /** Sets one parameter from its full value (every rank passes it). */
  public void setParameter(String name, Tensor value) {
    Native.check(Fsdp2Native.fsdp2j_set_parameter(handle(), name, value.buffer(), value.dtype(),
        value.shapeRef(), value.shapeRef().length));
  }

  /** Collective: every parameter's full value, by name. */
  public Map<String, Tensor> lightningModuleStateDict() {
    Map<String, Tensor> state = new LinkedHashMap<>();
    for (String name : parameterNames()) state.put(name, getParameter(name));
    return state;
  }

  public void loadModelStateDict(Map<String, Tensor> state) {
    for (Map.Entry<String, Tensor> e : state.entrySet()) setParameter(e.getKey(), e.getValue());
  }

  /** {epoch, optimizer steps taken}. */
  public long[] currentEpochStep() {
    long[] values = new long[2];
    Native.check(Fsdp2Native.fsdp2j_current_epoch_step(handle(), values));
    return values;
  }

  public void setEpoch(long epoch) {
    Native.check(Fsdp2Native.fsdp2j_set_epoch(handle(), epoch));
  }

  /** Collective. */
  public void barrier() {
    Native.check(Fsdp2Native.fsdp2j_barrier(handle()));
  }

  public void teardown() {
    Native.check(Fsdp2Native.fsdp2j_teardown(handle()));
  }
}
