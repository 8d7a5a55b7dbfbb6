package org.fsdp2;

/** What one training step did. */
public final class StepResult {
  /** Mean over micro-batches and data-parallel ranks. */
  public final double loss;
  /** Global gradient norm before clipping (0 without clipping). */
  public final double gradNorm;
  /** Optimizer steps taken so far. */
  public final long step;

  StepResult(double loss, double gradNorm, long step) {
    this.loss = loss;
    this.gradNorm = gradNorm;
    this.step = step;
  }
}
