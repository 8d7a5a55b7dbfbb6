package org.fsdp2;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * How the strategy builds the optimizer over the local shards (AdamW by
 * default): the library's optimizer options (fsdp2_optimizer_options_t), one
 * typed setter each, named as the option in camelCase; options not set keep
 * the library's defaults.
 */
public final class OptimizerOptions {
  private final Map<String, Object> options = new LinkedHashMap<>();

  public static OptimizerOptions adamw() {
    return new OptimizerOptions().set("kind", "adamw");
  }

  public static OptimizerOptions adam() {
    return new OptimizerOptions().set("kind", "adam");
  }

  public static OptimizerOptions sgd() {
    return new OptimizerOptions().set("kind", "sgd");
  }

  /** "adamw", "adam" or "sgd" (adamw(), adam() and sgd() start from it). */
  public OptimizerOptions kind(String kind) {
    return set("kind", kind);
  }

  public OptimizerOptions lr(double lr) {
    return set("lr", lr);
  }

  public OptimizerOptions betas(double beta1, double beta2) {
    return set("beta1", beta1).set("beta2", beta2);
  }

  /** Adam and AdamW: the first moment's decay. */
  public OptimizerOptions beta1(double beta1) {
    return set("beta1", beta1);
  }

  /** Adam and AdamW: the second moment's decay. */
  public OptimizerOptions beta2(double beta2) {
    return set("beta2", beta2);
  }

  /** Adam and AdamW: added to the denominator. */
  public OptimizerOptions eps(double eps) {
    return set("eps", eps);
  }

  public OptimizerOptions weightDecay(double weightDecay) {
    return set("weight_decay", weightDecay);
  }

  public OptimizerOptions momentum(double momentum) {
    return set("momentum", momentum);
  }

  /** Any option by its C name; unknown names fail at connect with the C message. */
  public OptimizerOptions set(String key, Object value) {
    options.put(key, value);
    return this;
  }

  String toJson() {
    return Native.jsonObject(options);
  }
}
