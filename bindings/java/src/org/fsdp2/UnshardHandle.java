package org.fsdp2;

import org.fsdp2.internal.Fsdp2Native;

/**
 * An all-gather started by {@link FSDP2Strategy#unshard(String, boolean)}
 * (PyTorch's handle from {@code FSDPModule.unshard(async_op=True)}).
 * {@link #await()} waits for it; {@link #close()} frees the handle without
 * waiting (the module's forward, or {@link FSDP2Strategy#reshard(String)},
 * still completes the all-gather).
 *
 * <pre>{@code
 * try (UnshardHandle gather = s.unshard("blocks.0", true)) {
 *   prepareTheNextBatch();   // overlaps the all-gather
 *   gather.await();          // blocks.0's parameters are whole
 * }
 * }</pre>
 */
public final class UnshardHandle extends Handle {
  UnshardHandle(long handle) {
    super(handle);
  }

  @Override
  void destroy(long handle) {
    Fsdp2Native.fsdp2_unshard_handle_destroy(handle);
  }

  /**
   * Waits for the all-gather: the module's parameters are then whole. Once;
   * later calls, and calls after the module's forward, its reshard or the
   * strategy's end, return at once.
   */
  public void await() {
    Fsdp2Native.fsdp2_unshard_handle_wait(handle());
  }
}
