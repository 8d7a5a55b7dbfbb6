// generated from README.md by docs/snippets/extract.py; edit the page, not this file
import java.util.Map;
import org.fsdp2.*;

public class QuickStart {
  public static void main(String[] args) {
    try (FSDP2Strategy s = FSDP2Strategy.builder().precision("fp32").build()) {
      s.setupEnvironment();                    // torchrun/srun/mpirun, or alone
      try (Model m = Model.gpt(Map.of("vocab_size", 64, "block_size", 16,
          "n_layer", 2, "n_head", 2, "n_embd", 32))) {
        s.connect(m, OptimizerOptions.adamw().lr(1e-2));
      }
      s.parallelize();
      long[] x = new long[4 * 16], y = new long[4 * 16];  // this rank's rows
      for (int i = 0; i < x.length; ++i) { x[i] = 3L * i % 64; y[i] = (x[i] + 3) % 64; }
      double first = 0, last = 0;
      for (int step = 0; step < 20; ++step) {
        last = s.trainingStep(step, 1, 1.0, Tensor.ofLongs(x, 4, 16), Tensor.ofLongs(y, 4, 16)).loss;
        if (step == 0) first = last;
      }
      s.saveCheckpoint("ckpt");
      System.out.printf("loss %.3f -> %.3f%n", first, last);
      if (!(last < first)) System.exit(1);
    }
  }
}
