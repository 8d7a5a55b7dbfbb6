package org.fsdp2;

import org.fsdp2.internal.Fsdp2Native;

/**
 * Loads the JNI library once and turns statuses into exceptions. The
 * library is the file named by the system property {@code fsdp2.jni}, or
 * {@code libfsdp2_jni.so} on {@code java.library.path}.
 */
final class Native {
  static {
    String path = System.getProperty("fsdp2.jni");
    if (path != null && !path.isEmpty()) {
      System.load(new java.io.File(path).getAbsolutePath());
    } else {
      System.loadLibrary("fsdp2_jni");
    }
    int abi = Fsdp2Native.fsdp2_abi_version();
    if (abi / 1000 != org.fsdp2.internal.Fsdp2NativeConstants.FSDP2_ABI_VERSION_MAJOR) {
      throw new UnsatisfiedLinkError("libfsdp2 ABI " + abi + " does not match these bindings");
    }
  }

  private Native() {}

  static void init() {}

  /** Throws unless {@code status} is OK (call on the thread that made the call). */
  static void check(int status) {
    if (status != Status.OK) {
      throw new FSDP2Exception(status, Fsdp2Native.fsdp2_status_name(status),
          Fsdp2Native.fsdp2_last_error());
    }
  }

  static String json(Object value) {
    if (value == null) return "null";
    if (value instanceof Number || value instanceof Boolean) return value.toString();
    StringBuilder s = new StringBuilder("\"");
    for (char c : value.toString().toCharArray()) {
      switch (c) {
        case '"': s.append("\\\""); break;
        case '\\': s.append("\\\\"); break;
        case '\n': s.append("\\n"); break;
        default:
          if (c < 0x20) s.append(String.format("\\u%04x", (int) c)); else s.append(c);
      }
    }
    return s.append('"').toString();
  }

  static String jsonObject(java.util.Map<String, Object> map) {
    StringBuilder s = new StringBuilder("{");
    for (java.util.Map.Entry<String, Object> e : map.entrySet()) {
      if (s.length() > 1) s.append(", ");
      s.append(json(e.getKey())).append(": ").append(json(e.getValue()));
    }
    return s.append('}').toString();
  }
}
