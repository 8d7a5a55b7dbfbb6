package org.fsdp2;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.fsdp2.internal.Fsdp2Native;

/**
 * A model the strategy trains: the GPT-style decoder (batch: tokens and
 * targets, [B, T] integers), the residual MLP (batch: x [B, in] float and y
 * [B, out] float or [B] int), or a TorchScript file (one FSDP unit).
 */
public final class Model extends Handle {
  private Model(long handle) {
    super(handle);
  }

  /** Set by FSDP2Strategy#tensorInitContext on this thread. */
  static final ThreadLocal<FSDP2Strategy> INIT_CONTEXT = new ThreadLocal<>();

  /**
   * From a JSON configuration, e.g. {"family": "gpt", "n_layer": 2}; built
   * deferred inside a strategy's tensorInitContext().
   */
  public static Model fromConfig(String json) {
    Native.init();
    long[] out = new long[1];
    FSDP2Strategy deferred = INIT_CONTEXT.get();
    if (deferred != null) {
      Fsdp2Native.fsdp2_model_create_deferred(deferred.nativeHandle(), json, out);
    } else {
      Fsdp2Native.fsdp2_model_create(json, out);
    }
    return new Model(out[0]);
  }

  /**
   * A Hugging Face Llama, Mistral or Qwen2 checkpoint directory (config.json
   * and model.safetensors, or shards with model.safetensors.index.json). Its
   * weights load in {@code parallelize()}, each rank reading only its rows;
   * built inside {@code tensorInitContext()} no rank ever holds the whole
   * model. Parameters are float32 unless {@code dtype} ("bfloat16",
   * "float16", "float64"; null: float32) says otherwise. Batch and
   * predictions as for {@link #gpt}; save with {@code FSDP2Strategy.saveHf}.
   */
  public static Model fromHf(String path, String dtype) {
    Map<String, Object> config = new LinkedHashMap<>();
    config.put("family", "hf");
    config.put("path", path);
    if (dtype != null) config.put("dtype", dtype);
    return fromConfig(Native.jsonObject(config));
  }

  /**
   * {@link #fromHf(String, String)} with LoRA adapters of rank {@code loraRank} (PEFT's r; 0: none)
   * on {@code loraTargetModules} (e.g. "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"),
   * scaled by {@code loraAlpha} / rank, with {@code loraDropout} on their input while training.
   * Every other weight is frozen; {@link FSDP2Strategy#saveHf} then writes the adapters in PEFT's
   * layout.
   */
  public static Model fromHf(
      String path,
      String dtype,
      long loraRank,
      double loraAlpha,
      double loraDropout,
      String loraTargetModules) {
    Map<String, Object> config = new LinkedHashMap<>();
    config.put("family", "hf");
    config.put("path", path);
    if (dtype != null) config.put("dtype", dtype);
    if (loraRank != 0) {
      config.put("lora_rank", loraRank);
      config.put("lora_alpha", loraAlpha);
      config.put("lora_dropout", loraDropout);
      if (loraTargetModules != null) config.put("lora_target_modules", loraTargetModules);
    }
    return fromConfig(Native.jsonObject(config));
  }

  /** {@link #fromHf(String, String)} in float32. */
  public static Model fromHf(String path) {
    return fromHf(path, null);
  }

  /** The GPT with the given sizes (vocab_size, block_size, n_layer, n_head, n_embd; dropout). */
  public static Model gpt(Map<String, Object> sizes) {
    Map<String, Object> config = new LinkedHashMap<>();
    config.put("family", "gpt");
    config.putAll(sizes);
    return fromConfig(Native.jsonObject(config));
  }

  /** The MLP with the given sizes (in_features, hidden, out_features, depth). */
  public static Model mlp(Map<String, Object> sizes) {
    Map<String, Object> config = new LinkedHashMap<>();
    config.put("family", "mlp");
    config.putAll(sizes);
    return fromConfig(Native.jsonObject(config));
  }

  /**
   * A TorchScript file, trained block by block: every child of every nn.ModuleList becomes its own
   * FSDP unit. loss is "mse" or "cross_entropy" (every batch tensor but the last goes to the
   * script's forward, the last is the target) or "model" (every tensor goes to forward, which
   * returns the loss).
   */
  public static Model fromTorchScript(String path, String loss) {
    Native.init();
    long[] out = new long[1];
    Fsdp2Native.fsdp2_model_load_torchscript(path, loss, out);
    return new Model(out[0]);
  }

  /**
   * As {@link #fromTorchScript(String, String)}, with the FSDP units named: submodule paths
   * ("blocks.3") and scripted class names ("Block"); an empty list keeps the whole script as one
   * unit. See fsdp2_model_load_torchscript_with_options in fsdp2.h.
   */
  public static Model fromTorchScript(String path, String loss, List<String> autoWrap) {
    Native.init();
    Map<String, Object> options = new LinkedHashMap<>();
    options.put("loss", loss);
    options.put("auto_wrap", new ArrayList<>(autoWrap));
    long[] out = new long[1];
    Fsdp2Native.fsdp2_model_load_torchscript_with_options(path, Native.jsonObject(options), out);
    return new Model(out[0]);
  }

  /** {parameter tensors, elements}, global sizes. */
  public long[] numParameters() {
    long[] tensors = new long[1], elements = new long[1];
    Fsdp2Native.fsdp2_model_num_parameters(handle(), tensors, elements);
    return new long[] {tensors[0], elements[0]};
  }

  long nativeHandle() {
    return handle();
  }

  @Override
  void destroy(long handle) {
    Fsdp2Native.fsdp2_model_destroy(handle);
  }
}
