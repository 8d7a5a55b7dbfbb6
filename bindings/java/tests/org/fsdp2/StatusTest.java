package org.fsdp2;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.fsdp2.internal.Fsdp2Native;
import org.junit.jupiter.api.Test;

/**
 * Every status of c_api/fsdp2.h (the file named by the system property
 * fsdp2.header) is a constant of {@link Status} with its value, and the
 * library names it alike.
 */
class StatusTest {
  @Test
  void everyStatusInTheHeaderIsAJavaStatus() throws Exception {
    String header = Files.readString(Path.of(System.getProperty("fsdp2.header")));
    Map<String, Integer> inHeader = new TreeMap<>();
    Matcher m = Pattern.compile("(?m)^\\s*FSDP2_(OK|ERROR_\\w+)\\s*=\\s*(\\d+)").matcher(header);
    while (m.find()) {
      inHeader.put(m.group(1).replaceFirst("^ERROR_", ""), Integer.parseInt(m.group(2)));
    }
    assertTrue(inHeader.containsKey("OK") && inHeader.containsKey("OUT_OF_MEMORY")
        && inHeader.containsKey("INTERNAL"), "statuses read from the header: " + inHeader);

    Map<String, Integer> inJava = new TreeMap<>();
    for (Field f : Status.class.getFields()) {
      if (Modifier.isStatic(f.getModifiers()) && f.getType() == int.class) {
        inJava.put(f.getName(), f.getInt(null));
      }
    }
    assertEquals(inHeader, inJava, "org.fsdp2.Status against c_api/fsdp2.h");

    Native.init();
    for (Map.Entry<String, Integer> e : inJava.entrySet()) {
      String cName = e.getKey().equals("OK") ? "FSDP2_OK" : "FSDP2_ERROR_" + e.getKey();
      assertEquals(cName, Fsdp2Native.fsdp2_status_name(e.getValue()));
    }
  }
}
