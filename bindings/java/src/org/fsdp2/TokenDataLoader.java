package org.fsdp2;

import org.fsdp2.internal.Fsdp2Native;

/** Batches read natively from a token file (see FSDP2Strategy#tokenDataLoader). */
public final class TokenDataLoader extends Handle {
  TokenDataLoader(long handle) {
    super(handle);
  }

  /** Global batches per epoch. */
  public long numBatches() {
    long[] count = new long[1];
    Fsdp2Native.fsdp2_dataloader_num_batches(handle(), count);
    return count[0];
  }

  public void setEpoch(long epoch) {
    Fsdp2Native.fsdp2_dataloader_set_epoch(handle(), epoch);
  }

  long nativeHandle() {
    return handle();
  }

  @Override
  void destroy(long handle) {
    Fsdp2Native.fsdp2_dataloader_destroy(handle);
  }
}
