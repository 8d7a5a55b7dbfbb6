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
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Your own PyTorch model from Java: tests/script/script_models.py (the venv's PyTorch, a
 * process of its own) scripts the masked model, forward(x, mask), and trains it with PyTorch;
 * fsdp2 trains the saved file in this JVM (a world of one) with each Residual block an FSDP unit
 * and must print PyTorch's losses.
 */
class TorchScriptTest {
  private static final int STEPS = 4;

  /** Runs script_models.py make MODEL DIR STEPS. */
  private static void make(String model, Path dir) throws Exception {
    Process p = new ProcessBuilder(System.getProperty("fsdp2.python"), System.getProperty("fsdp2.script_models"),
        "make", model, dir.toString(), Integer.toString(STEPS)).inheritIO().start();
    assertTrue(p.waitFor(300, TimeUnit.SECONDS), "script_models.py timed out");
    assertEquals(0, p.exitValue(), "script_models.py failed");
  }

  /** The number after "key": in a JSON text of script_models.py. */
  private static double number(String json, String key) {
    Matcher m = Pattern.compile("\"" + key + "\": ([-0-9.eE+]+)").matcher(json);
    assertTrue(m.find(), key + " in " + json);
    return Double.parseDouble(m.group(1));
  }

  /** The numbers of the array after "key": in a JSON text. */
  private static double[] numbers(String json, String key) {
    Matcher m = Pattern.compile("\"" + key + "\": \\[([^\\]]*)\\]").matcher(json);
    assertTrue(m.find(), key + " in " + json);
    String[] parts = m.group(1).split(",");
    double[] out = new double[parts.length];
    for (int i = 0; i < parts.length; ++i) out[i] = Double.parseDouble(parts[i].trim());
    return out;
  }

  /** The F32 and I64 tensors of a safetensors file, by name. */
  private static Map<String, Tensor> readSafetensors(Path path) throws Exception {
    ByteBuffer file = ByteBuffer.wrap(Files.readAllBytes(path)).order(ByteOrder.LITTLE_ENDIAN);
    int headerLength = (int) file.getLong(0);
    String header = new String(file.array(), 8, headerLength, StandardCharsets.UTF_8);
    Matcher m = Pattern.compile("\"([^\"]+)\":\\{\"dtype\":\"(\\w+)\",\"shape\":\\[([0-9,]*)\\],"
        + "\"data_offsets\":\\[(\\d+),(\\d+)\\]\\}").matcher(header);
    Map<String, Tensor> out = new HashMap<>();
    while (m.find()) {
      String[] dims = m.group(3).isEmpty() ? new String[0] : m.group(3).split(",");
      long[] shape = new long[dims.length];
      for (int i = 0; i < dims.length; ++i) shape[i] = Long.parseLong(dims[i]);
      int begin = 8 + headerLength + Integer.parseInt(m.group(4));
      int end = 8 + headerLength + Integer.parseInt(m.group(5));
      int dtype;
      switch (m.group(2)) {
        case "F32": dtype = Tensor.FLOAT32; break;
        case "I64": dtype = Tensor.INT64; break;
        default: throw new AssertionError("dtype " + m.group(2) + " of " + m.group(1));
      }
      Tensor t = Tensor.zeros(dtype, shape);
      t.buffer().duplicate().put(file.array(), begin, end - begin);  // little-endian
      out.put(m.group(1), t);
    }
    assertTrue(!out.isEmpty(), "no tensors in " + path);
    return out;
  }

  @Test
  void aScriptedModelWithTwoInputsTrainsToPyTorchsLosses(@TempDir Path dir) throws Exception {
    make("masked", dir);
    String reference = Files.readString(dir.resolve("reference.json"));
    double[] want = numbers(reference, "losses");
    double[] betas = numbers(reference, "betas");
    Map<String, Tensor> batches = readSafetensors(dir.resolve("batches.safetensors"));
    String script = dir.resolve("model.pt").toString();

    // An auto_wrap entry that names nothing lists the script's classes.
    FSDP2Exception bad = assertThrows(FSDP2Exception.class,
        () -> Model.fromTorchScript(script, "mse", List.of("Residul")));
    assertEquals(Status.INVALID_ARGUMENT, bad.status());
    assertTrue(bad.getMessage().contains("Residual"), bad.getMessage());

    double[] got = new double[STEPS];
    try (FSDP2Strategy s = FSDP2Strategy.builder().precision("fp32").build()) {
      s.setupEnvironment();
      try (Model model = Model.fromTorchScript(script, "mse", List.of("Residual"))) {
        s.connect(model, OptimizerOptions.adamw().lr(number(reference, "lr"))
            .betas(betas[0], betas[1]).set("eps", number(reference, "eps"))
            .weightDecay(number(reference, "weight_decay")));
      }
      s.parallelize();
      for (int step = 0; step < STEPS; ++step) {
        // forward(x, mask); the target last.
        got[step] = s.trainingStep(step, batches.get("s" + step + ".0"),
            batches.get("s" + step + ".1"), batches.get("s" + step + ".2")).loss;
      }
      // Each Residual block is a unit: its parameters are named as in PyTorch.
      assertTrue(s.parameterNames().contains("blocks.2.up.weight"), "" + s.parameterNames());
    }
    assertEquals(STEPS, want.length);
    for (int step = 0; step < STEPS; ++step) {
      assertEquals(want[step], got[step], 1e-5 * Math.abs(want[step]), "step " + step);
    }
  }
}
