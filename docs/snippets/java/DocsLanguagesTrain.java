// generated from docs/languages.md by docs/snippets/extract.py; edit the page, not this file
import java.util.Map;
import java.util.Random;
import org.fsdp2.*;

public final class DocsLanguagesTrain {
  public static void main(String[] args) {
    try (FSDP2Strategy s = FSDP2Strategy.builder().precision("fp32").build()) {
      s.setupEnvironment();  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
      try (Model m = Model.gpt(Map.of("vocab_size", 64, "block_size", 16, "n_layer", 2,
          "n_head", 2, "n_embd", 32))) {
        s.connect(m, OptimizerOptions.adamw().lr(3e-3));
      }
      s.parallelize();
      Random random = new Random(s.rank());  // this rank's rows
      for (int step = 0; step < 3; ++step) {
        long[] tokens = new long[4 * 16], targets = new long[4 * 16];
        for (int i = 0; i < tokens.length; ++i) {
          tokens[i] = random.nextInt(64);
          targets[i] = (tokens[i] * 5 + 1) % 64;  // a mapping the model can learn
        }
        StepResult r = s.trainingStep(step, Tensor.ofLongs(tokens, 4, 16),
            Tensor.ofLongs(targets, 4, 16));
        if (!Double.isFinite(r.loss)) throw new IllegalStateException("loss " + r.loss);
      }
      s.saveCheckpoint("ckpt");  // a relative directory
      s.loadCheckpoint("ckpt");
      if (s.currentEpochStep()[1] != 3) throw new IllegalStateException("step not restored");
    }
  }
}
