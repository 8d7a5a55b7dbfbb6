package org.fsdp2;

import org.fsdp2.internal.Fsdp2NativeConstants;

/** The C ABI's status codes, as {@link FSDP2Exception#status()} reports them. */
public final class Status {
  public static final int OK = Fsdp2NativeConstants.FSDP2_OK;
  public static final int INVALID_ARGUMENT = Fsdp2NativeConstants.FSDP2_ERROR_INVALID_ARGUMENT;
  public static final int INVALID_HANDLE = Fsdp2NativeConstants.FSDP2_ERROR_INVALID_HANDLE;
  public static final int WRONG_ORDER = Fsdp2NativeConstants.FSDP2_ERROR_WRONG_ORDER;
  public static final int SHAPE = Fsdp2NativeConstants.FSDP2_ERROR_SHAPE;
  public static final int IO = Fsdp2NativeConstants.FSDP2_ERROR_IO;
  public static final int RUNTIME = Fsdp2NativeConstants.FSDP2_ERROR_RUNTIME;

  private Status() {}
}
