package org.fsdp2;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A Hugging Face checkpoint fine-tuned from Java: tests/hf/hf_reference.py (the venv's
 * transformers, a process of its own) makes a tiny Qwen2 checkpoint and transformers' logits and
 * AdamW losses with half of the model frozen; fsdp2 loads it in this JVM (a world of one) inside
 * tensorInitContext(), trains it with the same parameters frozen and must give transformers'
 * numbers, then saves it in transformers' layout.
 */
class HfTest {
  /** The tensors of a safetensors file as doubles into `out`; their shapes by name. */
  private static Map<String, long[]> read(Path path, Map<String, double[]> out) throws Exception {
    ByteBuffer file = ByteBuffer.wrap(Files.readAllBytes(path)).order(ByteOrder.LITTLE_ENDIAN);
    int headerLength = (int) file.getLong(0);
    String header = new String(file.array(), 8, headerLength, StandardCharsets.UTF_8);
    Matcher m = Pattern.compile("\"([^\"]+)\":\\{\"dtype\":\"(\\w+)\",\"shape\":\\[([0-9,]*)\\],"
        + "\"data_offsets\":\\[(\\d+),(\\d+)\\]\\}").matcher(header);
    Map<String, long[]> shapes = new HashMap<>();
    while (m.find()) {
      String[] dims = m.group(3).isEmpty() ? new String[0] : m.group(3).split(",");
      long[] shape = new long[dims.length];
      for (int i = 0; i < dims.length; ++i) shape[i] = Long.parseLong(dims[i]);
      int begin = 8 + headerLength + Integer.parseInt(m.group(4));
      int end = 8 + headerLength + Integer.parseInt(m.group(5));
      String dtype = m.group(2);
      int size = dtype.equals("F32") ? 4 : 8;
      double[] v = new double[(end - begin) / size];
      for (int i = 0; i < v.length; ++i) {
        int at = begin + i * size;
        v[i] = dtype.equals("F32") ? file.getFloat(at)
            : dtype.equals("F64") ? file.getDouble(at) : (double) file.getLong(at);
      }
      out.put(m.group(1), v);
      shapes.put(m.group(1), shape);
    }
    return shapes;
  }

  /** Rows [first, first + rows) of a [steps, rows, T] token array, step `step`, as int64. */
  private static Tensor tokens(double[] all, long[] shape, int step) {
    int rows = (int) shape[1], t = (int) shape[2];
    long[] out = new long[rows * t];
    for (int i = 0; i < out.length; ++i) out[i] = (long) all[step * rows * t + i];
    return Tensor.ofLongs(out, rows, t);
  }

  @Test
  @SuppressWarnings("try")  // the init context works by existing
  void aQwen2CheckpointFineTunesLikeTransformers(@TempDir Path dir) throws Exception {
    Process p = new ProcessBuilder(System.getProperty("fsdp2.python"),
        System.getProperty("fsdp2.hf_reference"), "prepare", dir.toString()).inheritIO().start();
    assertTrue(p.waitFor(600, TimeUnit.SECONDS), "hf_reference.py timed out");
    assertEquals(0, p.exitValue(), "hf_reference.py failed");
    Map<String, double[]> data = new HashMap<>();
    Map<String, long[]> shapes = read(dir.resolve("data.safetensors"), data);
    Map<String, double[]> ref = new HashMap<>();
    read(dir.resolve("qwen2.frozen.ref.safetensors"), ref);
    String checkpoint = dir.resolve("qwen2").toString();

    FSDP2Exception bad = assertThrows(FSDP2Exception.class, () -> Model.fromHf(checkpoint, "int8"));
    assertEquals(Status.INVALID_ARGUMENT, bad.status());

    Path saved = dir.resolve("saved");
    try (FSDP2Strategy s = FSDP2Strategy.builder().precision("fp32")
        .frozenParams("model.embed_tokens.*", "model.layers.0.*", "*norm*").build()) {
      s.setupEnvironment();
      try (FSDP2Strategy.InitContext init = s.tensorInitContext();
          Model model = Model.fromHf(checkpoint)) {
        s.connect(model, OptimizerOptions.adamw().lr(1e-3).betas(0.9, 0.95).set("eps", 1e-8)
            .weightDecay(0.1));
      }
      s.parallelize();
      long[] evalShape = shapes.get("eval");
      long[] eval = new long[(int) (evalShape[0] * evalShape[1])];
      for (int i = 0; i < eval.length; ++i) eval[i] = (long) data.get("eval")[i];
      float[] logits = s.predictStep(0, Tensor.ofLongs(eval, evalShape)).toFloatArray();
      double[] want = ref.get("logits");
      double worst = 0, scale = 0;
      for (int i = 0; i < want.length; ++i) {
        worst = Math.max(worst, Math.abs(logits[i] - want[i]));
        scale = Math.max(scale, Math.abs(want[i]));
      }
      assertTrue(worst <= 1e-5 * scale, "logits differ from transformers' by " + worst);
      double[] losses = ref.get("losses");
      for (int step = 0; step < losses.length; ++step) {
        double loss = s.trainingStep(step, tokens(data.get("inputs"), shapes.get("inputs"), step),
            tokens(data.get("targets"), shapes.get("targets"), step)).loss;
        assertEquals(losses[step], loss, 1e-5 * losses[step], "step " + step);
      }
      s.saveHf(saved.toString(), "5GB", "bfloat16");
    }
    assertTrue(Files.exists(saved.resolve("model.safetensors")), "no model.safetensors");
    String config = Files.readString(saved.resolve("config.json"));
    assertTrue(config.contains("\"dtype\": \"bfloat16\""), config);
    // The tensors themselves (config.json does not decide their dtype): every one of the model's
    // is stored as BF16, 2 bytes an element.
    Map<String, String> savedTypes = dtypes(saved.resolve("model.safetensors"));
    Map<String, String> originalTypes = dtypes(dir.resolve("qwen2").resolve("model.safetensors"));
    assertEquals(originalTypes.keySet(), savedTypes.keySet(), "the saved tensors");
    for (Map.Entry<String, String> e : savedTypes.entrySet()) {
      assertEquals("BF16 2", e.getValue(), e.getKey() + ": dtype and bytes an element");
    }
  }

  /**
   * Each tensor's dtype and bytes per element, from a safetensors file's header (an 8-byte
   * little-endian length, then JSON, its keys in any order).
   */
  private static Map<String, String> dtypes(Path path) throws Exception {
    ByteBuffer file = ByteBuffer.wrap(Files.readAllBytes(path)).order(ByteOrder.LITTLE_ENDIAN);
    int headerLength = (int) file.getLong(0);
    String header = new String(file.array(), 8, headerLength, StandardCharsets.UTF_8);
    Matcher entry = Pattern.compile("\"([^\"]+)\":\\{([^{}]*)\\}").matcher(header);
    Map<String, String> types = new HashMap<>();
    while (entry.find()) {
      if (entry.group(1).equals("__metadata__")) continue;
      String body = entry.group(2);
      Matcher dtype = Pattern.compile("\"dtype\":\"(\\w+)\"").matcher(body);
      Matcher shape = Pattern.compile("\"shape\":\\[([0-9,]*)\\]").matcher(body);
      Matcher offsets = Pattern.compile("\"data_offsets\":\\[(\\d+),(\\d+)\\]").matcher(body);
      assertTrue(dtype.find() && shape.find() && offsets.find(), entry.group());
      long elements = 1;
      for (String d : shape.group(1).isEmpty() ? new String[0] : shape.group(1).split(",")) {
        elements *= Long.parseLong(d);
      }
      long bytes = Long.parseLong(offsets.group(2)) - Long.parseLong(offsets.group(1));
      types.put(entry.group(1), dtype.group(1) + " "
          + (elements == 0 || bytes % elements != 0 ? bytes + " bytes" : bytes / elements));
    }
    assertTrue(types.size() > 0, header);
    return types;
  }
}
