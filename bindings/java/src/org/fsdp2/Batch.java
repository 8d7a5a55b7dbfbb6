package org.fsdp2;

import org.fsdp2.internal.Fsdp2Native;

/** A native batch over tensors' buffers, alive for one call. */
final class Batch implements AutoCloseable {
  /** fsdp2j_batch's capacity in fsdp2_java.i; checked here so the refusal has a message. */
  static final int MAX_TENSORS = 16;

  final long handle;
  private final Tensor[] tensors;  // keeps the buffers reachable

  Batch(Tensor... tensors) {
    Native.init();
    if (tensors.length > MAX_TENSORS) {
      throw new IllegalArgumentException("a batch has at most " + MAX_TENSORS + " tensors, not "
          + tensors.length);
    }
    this.tensors = tensors.clone();
    this.handle = Fsdp2Native.fsdp2j_batch_new();
    if (handle == 0) throw new OutOfMemoryError("fsdp2 batch");
    try {
      for (Tensor t : this.tensors) {
        if (t == null) throw new IllegalArgumentException("a batch tensor is null");
        Native.check(Fsdp2Native.fsdp2j_batch_add(handle, t.buffer(), t.dtype(), t.shapeRef(),
            t.shapeRef().length));
      }
    } catch (RuntimeException e) {
      Fsdp2Native.fsdp2j_batch_free(handle);
      throw e;
    }
  }

  @Override
  public void close() {
    Fsdp2Native.fsdp2j_batch_free(handle);
  }
}
