package org.fsdp2;

/** A failed fsdp2 call: the C ABI's status and the library's message. */
public class FSDP2Exception extends RuntimeException {
  private static final long serialVersionUID = 1L;
  private final int status;
  private final String statusName;

  /** The JNI layer (bindings/java/fsdp2_java.i) calls this constructor for every failed call. */
  public FSDP2Exception(int status, String statusName, String message) {
    super(statusName + ": " + message);
    this.status = status;
    this.statusName = statusName;
  }

  /** The fsdp2_status_t code, e.g. {@code Status.SHAPE}. */
  public int status() {
    return status;
  }

  /** The status's name, e.g. "FSDP2_ERROR_SHAPE". */
  public String statusName() {
    return statusName;
  }
}
