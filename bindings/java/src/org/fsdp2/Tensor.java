package org.fsdp2;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import org.fsdp2.internal.Fsdp2Native;
import org.fsdp2.internal.Fsdp2NativeConstants;

/**
 * A dense row-major array in a direct ByteBuffer (native byte order), which
 * the library reads and writes in place, with its dtype and shape.
 */
public final class Tensor {
  public static final int FLOAT32 = Fsdp2NativeConstants.FSDP2_DTYPE_FLOAT32;
  public static final int FLOAT64 = Fsdp2NativeConstants.FSDP2_DTYPE_FLOAT64;
  public static final int BFLOAT16 = Fsdp2NativeConstants.FSDP2_DTYPE_BFLOAT16;
  public static final int FLOAT16 = Fsdp2NativeConstants.FSDP2_DTYPE_FLOAT16;
  public static final int INT64 = Fsdp2NativeConstants.FSDP2_DTYPE_INT64;
  public static final int INT32 = Fsdp2NativeConstants.FSDP2_DTYPE_INT32;
  public static final int UINT8 = Fsdp2NativeConstants.FSDP2_DTYPE_UINT8;
  public static final int UINT16 = Fsdp2NativeConstants.FSDP2_DTYPE_UINT16;

  // The JNI layer (bindings/java/fsdp2_java.i) reads these three fields by name.
  private final ByteBuffer buffer;
  private final int dtype;
  private final long[] shape;

  /**
   * Wraps a direct buffer of exactly numel(shape) elements of dtype, with at
   * most FSDP2_MAX_DIMS (8) dimensions.
   */
  public Tensor(ByteBuffer buffer, int dtype, long... shape) {
    Native.init();
    checkRank(shape);
    if (!buffer.isDirect()) throw new IllegalArgumentException("the buffer must be direct");
    long bytes = bytes(shape, dtype);
    if (Fsdp2Native.fsdp2_dtype_size(dtype) == 0) {
      throw new IllegalArgumentException("unknown dtype " + dtype);
    }
    if (buffer.capacity() != bytes) {
      throw new IllegalArgumentException("shape " + Arrays.toString(shape) + " needs " + bytes
          + " bytes, the buffer has " + buffer.capacity());
    }
    this.buffer = buffer.order(ByteOrder.nativeOrder());
    this.dtype = dtype;
    this.shape = shape.clone();
  }

  /** A zero-filled tensor (at most 2 GiB: one direct ByteBuffer). */
  public static Tensor zeros(int dtype, long... shape) {
    Native.init();
    checkRank(shape);
    long bytes = bytes(shape, dtype);
    if (bytes > Integer.MAX_VALUE) {
      throw new IllegalArgumentException("shape " + Arrays.toString(shape) + " needs " + bytes
          + " bytes, more than one ByteBuffer holds");
    }
    return new Tensor(ByteBuffer.allocateDirect((int) bytes), dtype, shape);
  }

  /**
   * A zero-filled tensor of what the library described: {dtype, ndim,
   * shape...}, as the JNI layer writes an fsdp2_tensor_t without data.
   */
  static Tensor zeros(long[] description) {
    long[] shape = new long[(int) description[1]];
    System.arraycopy(description, 2, shape, 0, shape.length);
    return zeros((int) description[0], shape);
  }

  /** Room for a description: dtype, ndim and FSDP2_MAX_DIMS sizes. */
  static long[] newDescription() {
    return new long[2 + Fsdp2NativeConstants.FSDP2_MAX_DIMS];
  }

  public static Tensor ofLongs(long[] data, long... shape) {
    Tensor t = zeros(INT64, shape);
    t.buffer.asLongBuffer().put(data);
    return t;
  }

  public static Tensor ofInts(int[] data, long... shape) {
    Tensor t = zeros(INT32, shape);
    t.buffer.asIntBuffer().put(data);
    return t;
  }

  public static Tensor ofFloats(float[] data, long... shape) {
    Tensor t = zeros(FLOAT32, shape);
    t.buffer.asFloatBuffer().put(data);
    return t;
  }

  public static Tensor ofDoubles(double[] data, long... shape) {
    Tensor t = zeros(FLOAT64, shape);
    t.buffer.asDoubleBuffer().put(data);
    return t;
  }

  public float[] toFloatArray() {
    float[] out = new float[(int) numel(shape)];
    buffer.asFloatBuffer().get(out);
    return out;
  }

  public long[] toLongArray() {
    long[] out = new long[(int) numel(shape)];
    buffer.asLongBuffer().get(out);
    return out;
  }

  public double[] toDoubleArray() {
    double[] out = new double[(int) numel(shape)];
    buffer.asDoubleBuffer().get(out);
    return out;
  }

  public ByteBuffer buffer() {
    return buffer;
  }

  public int dtype() {
    return dtype;
  }

  public long[] shape() {
    return shape.clone();
  }

  // Checked when the tensor is made, so a bad shape is refused where it was written.
  private static void checkRank(long[] shape) {
    if (shape.length > Fsdp2NativeConstants.FSDP2_MAX_DIMS) {
      throw new IllegalArgumentException("a tensor has at most "
          + Fsdp2NativeConstants.FSDP2_MAX_DIMS + " dimensions, not " + shape.length + ": "
          + Arrays.toString(shape));
    }
  }

  static long numel(long[] shape) {
    long n = 1;
    for (long s : shape) {
      if (s < 0) throw new IllegalArgumentException("negative size in " + Arrays.toString(shape));
      n = multiply(n, s, shape);
    }
    return n;
  }

  private static long multiply(long a, long b, long[] shape) {
    try {
      return Math.multiplyExact(a, b);
    } catch (ArithmeticException e) {
      throw new IllegalArgumentException("shape " + Arrays.toString(shape) + " is too large");
    }
  }

  private static long bytes(long[] shape, int dtype) {
    return multiply(numel(shape), Fsdp2Native.fsdp2_dtype_size(dtype), shape);
  }
}
