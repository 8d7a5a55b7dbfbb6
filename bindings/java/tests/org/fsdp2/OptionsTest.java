package org.fsdp2;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.fsdp2.internal.Fsdp2Native;
import org.fsdp2.internal.fsdp2_optimizer_options_t;
import org.fsdp2.internal.fsdp2_strategy_options_t;
import org.junit.jupiter.api.Test;

/**
 * Java's builders against the library's option table (fsdp2_options_schema):
 * every option has a typed setter named as the option in camelCase, and that
 * setter, given the option's default, sends the option's key with a value
 * the library takes and that changes nothing (Java holds no default of its
 * own that could differ).
 */
class OptionsTest {
  @Test
  void strategyBuilderHasATypedSetterForEveryOption() throws Exception {
    int invoked = 0;
    for (Map<String, Object> row : rows("strategy")) {
      Method setter = setterFor(FSDP2Strategy.Builder.class, row);
      if (setter == null) continue;  // a setter of several values: its existence is checked
      FSDP2Strategy.Builder builder = FSDP2Strategy.builder();
      setter.invoke(builder, argument(setter, row));
      String json = builder.toJson();
      assertTrue(json.contains("\"" + row.get("name") + "\""),
          setter + " does not set the option " + row.get("name") + ": " + json);
      assertSameOptions(strategyOptions("{}"), strategyOptions(json),
          "Builder." + setter.getName() + " given the default of " + row.get("name"));
      invoked++;
    }
    assertTrue(invoked >= rows("strategy").size() - 2, "most setters take one value");
  }

  @Test
  void optimizerOptionsHaveATypedSetterForEveryOption() throws Exception {
    for (Map<String, Object> row : rows("optimizer")) {
      Method setter = setterFor(OptimizerOptions.class, row);
      assertNotNull(setter, "OptimizerOptions." + camel((String) row.get("name"))
          + " takes one value of the option's type");
      OptimizerOptions options = new OptimizerOptions();
      setter.invoke(options, argument(setter, row));
      assertTrue(options.toJson().contains("\"" + row.get("name") + "\""), options.toJson());
      assertSameOptions(optimizerOptions("{}"), optimizerOptions(options.toJson()),
          "OptimizerOptions." + setter.getName() + " given the default of " + row.get("name"));
    }
  }

  // --- the setters -----------------------------------------------------------

  // Public methods named camel(name) of `type`; fails the test when there is
  // none. Returns the one that takes a single value of the row's type (null
  // when every such method takes several, e.g. forwardPrefetchModules(unit,
  // listed...)).
  private static Method setterFor(Class<?> type, Map<String, Object> row) {
    String name = camel((String) row.get("name"));
    List<Method> named = new ArrayList<>();
    for (Method m : type.getMethods()) {
      if (m.getName().equals(name) && !Modifier.isStatic(m.getModifiers())) named.add(m);
    }
    assertFalse(named.isEmpty(), type.getSimpleName() + " has no typed setter " + name
        + "(...) for the option " + row.get("name") + " (a row of the library's table)");
    for (Method m : named) {
      if (m.getParameterCount() == 1 && fits(m.getParameterTypes()[0], row)) return m;
    }
    return null;
  }

  private static boolean fits(Class<?> parameter, Map<String, Object> row) {
    Object value = row.get("default");
    switch ((String) row.get("type")) {
      case "bool": return parameter == boolean.class;
      case "int": return parameter == int.class || parameter == long.class;
      case "uint64": return parameter == long.class;
      case "number": return parameter == double.class;
      case "choice": return parameter == String.class;
      case "size": return parameter == (value instanceof String ? String.class : int.class);
      case "text":
        return value == null ? parameter == String[].class : parameter == String.class;
      default: return false;
    }
  }

  // The row's default as the setter's argument (none: an empty list).
  private static Object argument(Method setter, Map<String, Object> row) {
    Class<?> parameter = setter.getParameterTypes()[0];
    Object value = row.get("default");
    if (parameter == int.class) return ((Number) value).intValue();
    if (parameter == long.class) return ((Number) value).longValue();
    if (parameter == double.class) return ((Number) value).doubleValue();
    if (parameter == String[].class) return new String[0];
    return value;
  }

  static String camel(String name) {
    StringBuilder s = new StringBuilder();
    boolean upper = false;
    for (char c : name.toCharArray()) {
      if (c == '_') {
        upper = true;
      } else {
        s.append(upper ? Character.toUpperCase(c) : c);
        upper = false;
      }
    }
    return s.toString();
  }

  // --- the structs ------------------------------------------------------------

  private static Map<String, Object> strategyOptions(String json) throws Exception {
    try (fsdp2_strategy_options_t o = new fsdp2_strategy_options_t()) {
      Fsdp2Native.fsdp2_strategy_options_init(o);
      Fsdp2Native.fsdp2_strategy_options_from_json(json, o);
      return fields(o);
    }
  }

  private static Map<String, Object> optimizerOptions(String json) throws Exception {
    try (fsdp2_optimizer_options_t o = new fsdp2_optimizer_options_t()) {
      Fsdp2Native.fsdp2_optimizer_options_init(o);
      Fsdp2Native.fsdp2_optimizer_options_from_json(json, o);
      return fields(o);
    }
  }

  // Every field of a SWIG struct proxy, by its getter.
  private static Map<String, Object> fields(Object proxy) throws Exception {
    Map<String, Object> fields = new LinkedHashMap<>();
    for (Method m : proxy.getClass().getMethods()) {
      if (m.getName().startsWith("get") && m.getParameterCount() == 0
          && !Modifier.isStatic(m.getModifiers()) && m.getDeclaringClass() == proxy.getClass()) {
        fields.put(m.getName(), m.invoke(proxy));
      }
    }
    assertTrue(fields.size() > 5, "the struct's getters: " + fields.keySet());
    return fields;
  }

  private static void assertSameOptions(Map<String, Object> expected, Map<String, Object> got,
      String what) {
    for (Map.Entry<String, Object> field : expected.entrySet()) {
      assertEquals(field.getValue(), got.get(field.getKey()), what + " changed " + field.getKey());
    }
  }

  // --- the schema ---------------------------------------------------------------

  @SuppressWarnings("unchecked")
  private static List<Map<String, Object>> rows(String section) {
    Native.init();
    Map<String, Object> schema =
        (Map<String, Object>) new JsonReader(Fsdp2Native.fsdp2_options_schema()).value();
    List<Map<String, Object>> rows = (List<Map<String, Object>>) schema.get(section);
    assertNotNull(rows, section);
    assertFalse(rows.isEmpty(), section);
    return rows;
  }

  // The JSON the schema is written in: objects as LinkedHashMap, arrays as
  // ArrayList, numbers as Long or Double, true/false, null, strings.
  private static final class JsonReader {
    private final String text;
    private int at;

    JsonReader(String text) {
      this.text = text;
    }

    Object value() {
      skip();
      char c = text.charAt(at);
      if (c == '{') {
        Map<String, Object> object = new LinkedHashMap<>();
        at++;
        skip();
        if (text.charAt(at) == '}') {
          at++;
          return object;
        }
        while (true) {
          skip();
          String key = (String) value();
          skip();
          expect(':');
          object.put(key, value());
          skip();
          if (text.charAt(at++) == '}') return object;
        }
      }
      if (c == '[') {
        List<Object> array = new ArrayList<>();
        at++;
        skip();
        if (text.charAt(at) == ']') {
          at++;
          return array;
        }
        while (true) {
          array.add(value());
          skip();
          if (text.charAt(at++) == ']') return array;
        }
      }
      if (c == '"') return string();
      for (String word : new String[] {"true", "false", "null"}) {
        if (text.startsWith(word, at)) {
          at += word.length();
          return word.equals("null") ? null : Boolean.valueOf(word);
        }
      }
      int start = at;
      while (at < text.length() && "+-0123456789.eE".indexOf(text.charAt(at)) >= 0) at++;
      String number = text.substring(start, at);
      if (number.matches("-?[0-9]+")) return Long.parseLong(number);
      return Double.parseDouble(number);
    }

    private String string() {
      StringBuilder s = new StringBuilder();
      at++;
      while (text.charAt(at) != '"') {
        char c = text.charAt(at++);
        if (c == '\\') {
          char e = text.charAt(at++);
          switch (e) {
            case 'n': s.append('\n'); break;
            case 't': s.append('\t'); break;
            case 'u': s.append((char) Integer.parseInt(text.substring(at, at + 4), 16)); at += 4;
              break;
            default: s.append(e);
          }
        } else {
          s.append(c);
        }
      }
      at++;
      return s.toString();
    }

    private void skip() {
      while (at < text.length() && Character.isWhitespace(text.charAt(at))) at++;
    }

    private void expect(char c) {
      if (text.charAt(at++) != c) throw new IllegalArgumentException("expected " + c + " at " + at);
    }
  }
}
