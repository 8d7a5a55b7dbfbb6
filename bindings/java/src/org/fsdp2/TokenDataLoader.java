package org.fsdp2;

import org.fsdp2.internal.Fsdp2Native;

/** Batches read natively from a token file (see FSDP2Strategy#tokenDataLoader). */
public final class TokenDataLoader extends Handle {
  TokenDataLoader(long handle) {
    super(handle);
  }

  /** Global batches per epoch. */
  public long numBatches() {
    long[] values = new long[1];
    Native.check(Fsdp2Native.fsdp2j_loader_num_batches(handle(), values));
    return values[0];
  }

  public void setEpoch(long epoch) {
    Native.check(Fsdp2Native.fsdp2j_loader_set_epoch(handle(), epoch));
  }

  long nativeHandle() {
    return handle();
  }

  @Override
  void destroy(long handle) {
    Fsdp2Native.fsdp2j_loader_destroy(handle);
  }
}
