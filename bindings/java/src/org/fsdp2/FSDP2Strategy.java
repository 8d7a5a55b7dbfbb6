package org.fsdp2;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.fsdp2.internal.Fsdp2Native;
import org.fsdp2.internal.fsdp2_memory_stats_t;
import org.fsdp2.internal.fsdp2_optimizer_options_t;
import org.fsdp2.internal.fsdp2_step_options_t;
import org.fsdp2.internal.fsdp2_step_result_t;
import org.fsdp2.internal.fsdp2_token_loader_options_t;

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
  /**
   * Options by their C names (the library's option table: see
   * fsdp2_options_schema in fsdp2.h; unknown ones fail in build()). Each
   * option has a typed setter named as the option in camelCase; options not
   * set keep the library's defaults (the builder holds none of its own).
   */
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

    /**
     * Reshard after forward only down to groups of this many consecutive ranks
     * (a host's), so backward all-gathers stay inside them; it divides the
     * shard group. 1: fully, as reshardAfterForward(true).
     */
    public Builder reshardAfterForward(int groupSize) {
      return set("reshard_after_forward", groupSize);
    }

    /** HYBRID_SHARD: ranks per sharding group (0: one node). */
    public Builder shardGroupSize(int ranks) {
      return set("shard_group_size", ranks);
    }

    /**
     * How many units ahead forward and backward all-gather (default 1; 0: none,
     * least memory; each further unit holds one more unit's parameters).
     */
    public Builder prefetch(int forward, int backward) {
      return forwardPrefetch(forward).backwardPrefetch(backward);
    }

    /** How many units ahead forward all-gathers (see prefetch). */
    public Builder forwardPrefetch(int units) {
      return set("forward_prefetch", units);
    }

    /** How many units ahead backward all-gathers (see prefetch). */
    public Builder backwardPrefetch(int units) {
      return set("backward_prefetch", units);
    }

    /**
     * Micro-batches without gradient sync: "local" (the default: keep unsharded
     * gradients, communicate at the last) or "sharded" (reduce-scatter each one,
     * all-reduce across replicas at the last: less memory, same cross-host bytes).
     */
    public Builder gradientAccumulation(String mode) {
      return set("gradient_accumulation", mode);
    }

    /** Reduced gradients are divided by this (0, the default: the data-parallel size; 1: sum). */
    public Builder gradientDivideFactor(double factor) {
      return set("gradient_divide_factor", factor);
    }

    /**
     * Parameters kept out of sharding: names or glob patterns ("lm_head.*").
     * Each stays whole on every rank, never sharded, gathered or reduced; under
     * bf16 it is cast with its block for the block's forward and backward, its
     * value and gradient staying in its own dtype. allReduce: backward all-reduces their gradients (training equals one
     * process); false, as in PyTorch: each rank keeps its own.
     */
    public Builder ignoredParams(boolean allReduce, String... patterns) {
      return ignoredParams(patterns).ignoredParamsAllReduce(allReduce);
    }

    /** Parameters kept out of sharding (see ignoredParams(boolean, String...)). */
    public Builder ignoredParams(String... patterns) {
      return set("ignored_params", java.util.Arrays.asList(patterns));
    }

    /**
     * Whether backward all-reduces the ignored parameters' gradients (training
     * equals one process); false, as in PyTorch: each rank keeps its own.
     */
    public Builder ignoredParamsAllReduce(boolean allReduce) {
      return set("ignored_params_all_reduce", allReduce);
    }

    /**
     * Parameters not trained at all (names or glob patterns, as for
     * ignoredParams): no gradient, no reduction, no optimizer state.
     */
    public Builder frozenParams(String... patterns) {
      return set("frozen_params", java.util.Arrays.asList(patterns));
    }

    /**
     * When unit's forward begins, all-gather the listed units too, in place of
     * the forward prefetch depth for it (module names; "" is the root). Call
     * once per unit.
     */
    public Builder forwardPrefetchModules(String unit, String... listed) {
      return appendList("forward_prefetch_modules", unit, listed);
    }

    /** As forwardPrefetchModules, for the unit's backward. */
    public Builder backwardPrefetchModules(String unit, String... listed) {
      return appendList("backward_prefetch_modules", unit, listed);
    }

    // The C ABI's text form: "unit:a,b;unit:c".
    private Builder appendList(String key, String unit, String... listed) {
      Object old = options.get(key);
      String entry = unit + ":" + String.join(",", listed);
      return set(key, old == null ? entry : old + ";" + entry);
    }

    /**
     * CPU offload (Lightning's "fsdp_cpu_offload"): each rank's shards, their
     * gradients and the optimizer's state in host memory, the optimizer
     * stepping there unit by unit during the backward. On the CPU it changes
     * nothing. Default false.
     */
    public Builder cpuOffload(boolean offload) {
      return set("cpu_offload", offload);
    }

    /**
     * With CPU offload: host buffers in page-locked memory, so that copies to
     * and from the GPU run asynchronously. Default true.
     */
    public Builder pinMemory(boolean pin) {
      return set("pin_memory", pin);
    }

    /**
     * Caps this process's GPU memory at this many GiB, a smaller GPU
     * emulated: a step that does not fit throws the out-of-memory
     * FSDP2Exception. 0 (the default): the whole GPU.
     */
    public Builder gpuMemoryLimitGib(double gib) {
      return set("gpu_memory_limit_gib", gib);
    }

    /**
     * A Chrome/Perfetto trace of this many training steps through LibTorch's
     * profiler (CPU ops; on a GPU CUDA kernels, copies and the collectives'
     * streams), written to {@link #profilePath}. 0 (the default): none.
     */
    public Builder profileSteps(int steps) {
      return set("profile_steps", steps);
    }

    /** Steps run before the trace starts. Default 1 (the first step's one-time costs stay out). */
    public Builder profileWaitSteps(int steps) {
      return set("profile_wait_steps", steps);
    }

    /**
     * The trace file (default "fsdp2_trace.json"); with several ranks rank r
     * writes it with ".rank&lt;r&gt;" before the extension.
     */
    public Builder profilePath(String path) {
      return set("profile_path", path);
    }

    /**
     * Where each rank trains: "auto" (the default: its GPU where CUDA devices
     * are visible, else the CPU), "cpu", "cuda" (the local rank's GPU) or
     * "cuda:K".
     */
    public Builder device(String device) {
      return set("device", device);
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

    /**
     * Activation checkpointing: none (the default), full (every transformer block recomputes
     * its activations in backward instead of keeping them) or selective (every
     * {@link #acEvery}-th block).
     */
    public Builder activationCheckpointing(String mode) {
      return set("activation_checkpointing", mode);
    }

    /** true: full activation checkpointing; false: none. */
    public Builder activationCheckpointing(boolean enabled) {
      return set("activation_checkpointing", enabled);
    }

    /** Selective activation checkpointing: every k-th block (default 2). */
    public Builder acEvery(int k) {
      return set("ac_every", k);
    }

    /** Any option by its C name (a String, Number or Boolean); unknown names fail in build(). */
    public Builder set(String key, Object value) {
      options.put(key, value);
      return this;
    }

    /** The options set so far, as the JSON build() sends. */
    String toJson() {
      return Native.jsonObject(options);
    }

    public FSDP2Strategy build() {
      Native.init();
      long[] out = new long[1];
      Fsdp2Native.fsdp2_strategy_create_from_json(toJson(), out);
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
    Fsdp2Native.fsdp2_strategy_destroy(handle);
  }

  /** Collective: joins the job, builds the (dp, tp) mesh, seeds every rank. */
  public void setupEnvironment() {
    Fsdp2Native.fsdp2_strategy_setup_environment(handle());
  }

  public int rank() {
    int[] rank = new int[1];
    Fsdp2Native.fsdp2_strategy_rank_info(handle(), rank, null, null, null);
    return rank[0];
  }

  public int worldSize() {
    int[] worldSize = new int[1];
    Fsdp2Native.fsdp2_strategy_rank_info(handle(), null, worldSize, null, null);
    return worldSize[0];
  }

  public int dataParallelRank() {
    int[] rank = new int[1];
    Fsdp2Native.fsdp2_strategy_rank_info(handle(), null, null, rank, null);
    return rank[0];
  }

  public int dataParallelSize() {
    int[] size = new int[1];
    Fsdp2Native.fsdp2_strategy_rank_info(handle(), null, null, null, size);
    return size[0];
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
    try (fsdp2_optimizer_options_t o = new fsdp2_optimizer_options_t()) {
      Fsdp2Native.fsdp2_optimizer_options_init(o);
      Fsdp2Native.fsdp2_optimizer_options_from_json(json, o);
      Fsdp2Native.fsdp2_strategy_connect(handle(), model.nativeHandle(), o);
    }
  }

  /** Collective: shards the model (each block, then the root), builds the optimizer. */
  public void parallelize() {
    Fsdp2Native.fsdp2_strategy_parallelize(handle());
  }

  /** Collective: one optimizer step on this rank's rows, with the library's step options. */
  public StepResult trainingStep(long batchIdx, Tensor... batch) {
    return trainingStep(batchIdx, new LinkedHashMap<>(), batch);
  }

  /** With gradient accumulation over equal micro-batches and global-norm clipping (0: off). */
  public StepResult trainingStep(long batchIdx, int accumulateGradBatches, double gradientClipVal,
      Tensor... batch) {
    Map<String, Object> options = new LinkedHashMap<>();
    options.put("accumulate_grad_batches", accumulateGradBatches);
    options.put("gradient_clip_val", gradientClipVal);
    return trainingStep(batchIdx, options, batch);
  }

  /**
   * With step options by their C names (fsdp2_step_options_t; the library's
   * table: fsdp2_options_schema); those not given keep the library's defaults.
   */
  public StepResult trainingStep(long batchIdx, Map<String, Object> stepOptions,
      Tensor... batch) {
    try (fsdp2_step_options_t options = stepOptions(stepOptions);
        fsdp2_step_result_t result = new fsdp2_step_result_t()) {
      Fsdp2Native.fsdp2_strategy_training_step(handle(), batch, batchIdx, options, result);
      return new StepResult(result.getLoss(), result.getGrad_norm(), result.getStep());
    }
  }

  private static fsdp2_step_options_t stepOptions(Map<String, Object> given) {
    fsdp2_step_options_t options = new fsdp2_step_options_t();
    Fsdp2Native.fsdp2_step_options_init(options);
    Fsdp2Native.fsdp2_step_options_from_json(Native.jsonObject(given), options);
    return options;
  }

  /** Collective: the loss without gradients, averaged over data-parallel ranks. */
  public double validationStep(long batchIdx, Tensor... batch) {
    double[] loss = new double[1];
    Fsdp2Native.fsdp2_strategy_validation_step(handle(), batch, batchIdx, loss);
    return loss[0];
  }

  public double testStep(long batchIdx, Tensor... batch) {
    double[] loss = new double[1];
    Fsdp2Native.fsdp2_strategy_test_step(handle(), batch, batchIdx, loss);
    return loss[0];
  }

  /** Collective: this rank's prediction, in a new tensor. */
  public Tensor predictStep(long batchIdx, Tensor... batch) {
    long[] description = Tensor.newDescription();
    Fsdp2Native.fsdp2_strategy_predict_shape(handle(), batch, description);
    Tensor out = Tensor.zeros(description);
    Fsdp2Native.fsdp2_strategy_predict_step(handle(), batch, batchIdx, out);
    return out;
  }

  /** A loader over a token file: UINT8 (a text's bytes), UINT16 or INT32 tokens. */
  public TokenDataLoader tokenDataLoader(String path, int tokenDtype, long blockSize,
      long globalBatchSize, double beginFraction, double endFraction) {
    long[] out = new long[1];
    try (fsdp2_token_loader_options_t o = new fsdp2_token_loader_options_t()) {
      Fsdp2Native.fsdp2_token_loader_options_init(o);
      o.setToken_dtype(tokenDtype);
      o.setBlock_size(blockSize);
      o.setGlobal_batch_size(globalBatchSize);
      o.setBegin_fraction(beginFraction);
      o.setEnd_fraction(endFraction);
      Fsdp2Native.fsdp2_dataloader_create_from_token_file(handle(), path, o, out);
    }
    return new TokenDataLoader(out[0]);
  }

  public StepResult trainingStep(TokenDataLoader loader, long batchIdx, double gradientClipVal) {
    Map<String, Object> given = new LinkedHashMap<>();
    given.put("gradient_clip_val", gradientClipVal);
    try (fsdp2_step_options_t options = stepOptions(given);
        fsdp2_step_result_t result = new fsdp2_step_result_t()) {
      Fsdp2Native.fsdp2_strategy_training_step_loader(handle(), loader.nativeHandle(), batchIdx,
          options, result);
      return new StepResult(result.getLoss(), result.getGrad_norm(), result.getStep());
    }
  }

  public double validationStep(TokenDataLoader loader, long batchIdx) {
    double[] loss = new double[1];
    Fsdp2Native.fsdp2_strategy_validation_step_loader(handle(), loader.nativeHandle(), batchIdx,
        loss);
    return loss[0];
  }

  /** Collective: model, optimizer and counters, written atomically. */
  public void saveCheckpoint(String path) {
    Fsdp2Native.fsdp2_strategy_save_checkpoint(handle(), path);
  }

  /**
   * Collective: with {@code async} the files are written by a background
   * thread while training goes on (at most one save in flight).
   */
  public void saveCheckpoint(String path, boolean async) {
    Fsdp2Native.fsdp2_strategy_save_checkpoint_ex(handle(), path, async ? 1L : 0L);
  }

  /**
   * Collective: writes a {@code Model.fromHf} model as transformers'
   * save_pretrained does (config.json; model.safetensors, or shards of at
   * most {@code maxShardSize}, e.g. "5GB", with their index), in {@code
   * dtype} ("bfloat16", ...; null: the parameters' own).
   */
  public void saveHf(String path, String maxShardSize, String dtype) {
    saveHf(path, maxShardSize, dtype, false);
  }

  /**
   * Collective: as {@link #saveHf(String, String, String)}, with the source's tokenizer files and
   * generation_config.json. A model with LoRA adapters saves only them, in PEFT's layout, unless
   * {@code merged}: then the whole model with the adapters merged into its weights.
   */
  public void saveHf(String path, String maxShardSize, String dtype, boolean merged) {
    Map<String, Object> options = new java.util.LinkedHashMap<>();
    options.put("max_shard_size", maxShardSize);
    if (dtype != null) options.put("dtype", dtype);
    options.put("merged", merged);
    Fsdp2Native.fsdp2_strategy_save_hf_checkpoint(handle(), path, Native.jsonObject(options));
  }

  /** Waits for this rank's background save; throws its error. */
  public void waitForCheckpoint() {
    Fsdp2Native.fsdp2_strategy_wait_for_checkpoint(handle());
  }

  /** Whether this rank is still writing a background save. */
  public boolean checkpointInFlight() {
    int[] inFlight = new int[1];
    Fsdp2Native.fsdp2_strategy_checkpoint_in_flight(handle(), inFlight);
    return inFlight[0] != 0;
  }

  /** Collective: a checkpoint saved on any number of ranks. */
  public void loadCheckpoint(String path) {
    Fsdp2Native.fsdp2_strategy_load_checkpoint(handle(), path);
  }

  public void removeCheckpoint(String path) {
    Fsdp2Native.fsdp2_strategy_remove_checkpoint(handle(), path);
  }

  /** This rank's optimizer state (of its shards). */
  public byte[] optimizerStateDict() {
    byte[][] state = new byte[1][];
    Fsdp2Native.fsdp2_strategy_optimizer_state_dict(handle(), state);
    return state[0];
  }

  /** Applied at the next training step, once (deferred restoration). */
  public void loadOptimizerStateDict(byte[] state) {
    Fsdp2Native.fsdp2_strategy_load_optimizer_state_dict(handle(), state);
  }

  public boolean hasPendingOptimizerState() {
    int[] pending = new int[1];
    Fsdp2Native.fsdp2_strategy_has_pending_optimizer_state(handle(), pending);
    return pending[0] != 0;
  }

  /** The parameters' names, in order. */
  public List<String> parameterNames() {
    long[] count = new long[1];
    Fsdp2Native.fsdp2_strategy_num_parameters(handle(), count);
    List<String> names = new ArrayList<>();
    String[] name = new String[1];
    for (long i = 0; i < count[0]; ++i) {
      Fsdp2Native.fsdp2_strategy_parameter_info(handle(), i, name, null);
      names.add(name[0]);
    }
    return names;
  }

  /** Collective: the full value of one parameter. */
  public Tensor getParameter(String name) {
    int index = parameterNames().indexOf(name);
    if (index < 0) {
      // Let the library say what is wrong.
      Fsdp2Native.fsdp2_strategy_get_parameter(handle(), name, Tensor.zeros(Tensor.FLOAT32, 0));
    }
    long[] description = Tensor.newDescription();
    Fsdp2Native.fsdp2_strategy_parameter_info(handle(), index, null, description);
    Tensor out = Tensor.zeros(description);
    Fsdp2Native.fsdp2_strategy_get_parameter(handle(), name, out);
    return out;
  }

  /** Sets one parameter from its full value (every rank passes it). */
  public void setParameter(String name, Tensor value) {
    Fsdp2Native.fsdp2_strategy_set_parameter(handle(), name, value);
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

  /**
   * Collective: full parameters by name from a safetensors file: a PyTorch
   * model's state_dict() saved as safetensors, or a full checkpoint (its
   * directory or file).
   */
  public void loadModelStateDict(String safetensorsPath) {
    Fsdp2Native.fsdp2_strategy_load_model_state_dict_file(handle(), safetensorsPath);
  }

  /**
   * Collective over the module's shard group: all-gathers the parameters of
   * the sharded module {@code module} (its name as the model names its
   * modules, e.g. "blocks.0"; "" is the root) ahead of its forward, which
   * then finds them gathered (PyTorch's {@code FSDPModule.unshard}). With
   * {@code async} the call returns at once: {@link UnshardHandle#await()}
   * (or the module's forward) completes the all-gather; close the handle.
   * After {@link #parallelize()}; a name that is not a sharded module
   * throws, naming it. Every rank makes the same calls in the same order.
   */
  public UnshardHandle unshard(String module, boolean async) {
    long[] out = new long[1];
    Fsdp2Native.fsdp2_strategy_unshard(handle(), module, async ? 1 : 0, out);
    return new UnshardHandle(out[0]);
  }

  /**
   * Collective over the module's shard group: frees the gathered parameters
   * of the sharded module {@code module}, waiting for an all-gather in
   * flight; nothing when they are sharded (PyTorch's
   * {@code FSDPModule.reshard}).
   */
  public void reshard(String module) {
    Fsdp2Native.fsdp2_strategy_reshard(handle(), module);
  }

  /**
   * What this rank holds, in bytes (see {@link MemoryStats}). Local, not
   * collective; after {@link #parallelize()}.
   */
  public MemoryStats memoryStats() {
    try (fsdp2_memory_stats_t stats = new fsdp2_memory_stats_t()) {
      Fsdp2Native.fsdp2_memory_stats_init(stats);
      Fsdp2Native.fsdp2_strategy_memory_stats(handle(), stats);
      return new MemoryStats(stats.getSharded_param_bytes(), stats.getSharded_grad_bytes(),
          stats.getOptimizer_state_bytes(), stats.getUnsharded_param_bytes(),
          stats.getPeak_unsharded_param_bytes(), stats.getUnsharded_grad_bytes(),
          stats.getTotal_param_bytes(), stats.getRss_bytes(), stats.getPeak_rss_bytes(),
          stats.getDevice_allocated_bytes(), stats.getDevice_reserved_bytes(),
          stats.getPeak_device_allocated_bytes(), stats.getPeak_device_reserved_bytes());
    }
  }

  /**
   * Starts a new measurement: the peaks of {@link MemoryStats} restart from
   * what is held now (both are process-wide).
   */
  public void resetPeakMemoryStats() {
    Fsdp2Native.fsdp2_strategy_reset_peak_memory_stats(handle());
  }

  /** {epoch, optimizer steps taken}. */
  public long[] currentEpochStep() {
    long[] epoch = new long[1], step = new long[1];
    Fsdp2Native.fsdp2_strategy_current_epoch_step(handle(), epoch, step);
    return new long[] {epoch[0], step[0]};
  }

  public void setEpoch(long epoch) {
    Fsdp2Native.fsdp2_strategy_set_epoch(handle(), epoch);
  }

  /** Collective. */
  public void barrier() {
    Fsdp2Native.fsdp2_strategy_barrier(handle());
  }

  public void teardown() {
    Fsdp2Native.fsdp2_strategy_teardown(handle());
  }
}
