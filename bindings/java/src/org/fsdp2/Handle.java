package org.fsdp2;

/** Owns one C handle; close() destroys it, and later use throws. */
abstract class Handle implements AutoCloseable {
  private long handle;

  Handle(long handle) {
    this.handle = handle;
  }

  /** The live handle; throws FSDP2Exception(INVALID_HANDLE) once closed. */
  final long handle() {
    if (handle == 0) {
      throw new FSDP2Exception(Status.INVALID_HANDLE, "FSDP2_ERROR_INVALID_HANDLE",
          "this " + getClass().getSimpleName() + " is closed");
    }
    return handle;
  }

  public final boolean isClosed() {
    return handle == 0;
  }

  abstract void destroy(long handle);

  @Override
  public final void close() {
    if (handle != 0) {
      destroy(handle);
      handle = 0;
    }
  }
}
