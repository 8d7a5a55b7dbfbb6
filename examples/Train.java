// fsdp2/examples/Train.java
//
// Trains the GPT-style model with FSDP2 from Java (org.fsdp2):
//
//   bazel build //examples:train_java //bindings/java:libfsdp2_jni.so
//   java -Dfsdp2.jni=$PWD/bazel-bin/bindings/java/libfsdp2_jni.so \
//        -cp bazel-bin/bindings/java/fsdp2.jar:bazel-bin/examples/train_java.jar \
//        Train --nproc 2 --steps 20 --ckpt-dir /tmp/ckpt_java
//
// Started by hand it runs its own JVM command line again as --nproc local
// ranks; under torchrun, srun or mpirun each JVM is one rank. The text is a
// file's bytes (default: the GPL-3 text every Debian machine ships), read
// natively by the token-file loader, 90% for training and 10% for
// validation. At the end every rank writes its shards of a checkpoint.
import java.util.Map;
import org.fsdp2.FSDP2Exception;
import org.fsdp2.FSDP2Strategy;
import org.fsdp2.Launcher;
import org.fsdp2.Model;
import org.fsdp2.OptimizerOptions;
import org.fsdp2.StepResult;
import org.fsdp2.Tensor;
import org.fsdp2.TokenDataLoader;

public final class Train {
  public static void main(String[] args) {
    int nproc = 2, steps = 20, batchSize = 4;
    String data = "/usr/share/common-licenses/GPL-3", ckptDir = null;
    for (int i = 0; i < args.length; i += 2) {
      if (i + 1 >= args.length) usage();
      switch (args[i]) {
        case "--nproc": nproc = Integer.parseInt(args[i + 1]); break;
        case "--steps": steps = Integer.parseInt(args[i + 1]); break;
        case "--batch-size": batchSize = Integer.parseInt(args[i + 1]); break;
        case "--data": data = args[i + 1]; break;
        case "--ckpt-dir": ckptDir = args[i + 1]; break;
        default: usage();
      }
    }
    try {
      if (!Launcher.isRankProcess()) System.exit(Launcher.launchLocal(nproc));
      train(steps, batchSize, data, ckptDir);
    } catch (FSDP2Exception e) {
      System.err.println("Train: " + e.getMessage());
      System.exit(1);
    }
  }

  private static void usage() {
    System.err.println("usage: Train [--nproc N] [--steps N] [--batch-size N] [--data FILE] "
        + "[--ckpt-dir DIR]");
    System.exit(2);
  }

  private static void train(int steps, int batchSize, String data, String ckptDir) {
    try (FSDP2Strategy strategy = FSDP2Strategy.builder().precision("fp32").seed(1337).build()) {
      strategy.setupEnvironment();
      long params;
      // Built after setupEnvironment, which seeds every rank alike.
      try (Model model = Model.gpt(Map.of("vocab_size", 256, "block_size", 64, "n_layer", 2,
          "n_head", 4, "n_embd", 64))) {
        strategy.connect(model, OptimizerOptions.adamw().lr(3e-3).betas(0.9, 0.95).weightDecay(0.1));
        params = model.numParameters()[1];
      }
      strategy.parallelize();
      boolean rank0 = strategy.rank() == 0;
      System.out.printf("Train.java: rank %d of %d, allocator %s%n", strategy.rank(),
          strategy.worldSize(), Launcher.allocator());
      long globalBatch = (long) batchSize * strategy.dataParallelSize();
      try (TokenDataLoader train = strategy.tokenDataLoader(data, Tensor.UINT8, 64, globalBatch, 0, 0.9);
           TokenDataLoader val = strategy.tokenDataLoader(data, Tensor.UINT8, 64, globalBatch, 0.9, 1)) {
        long batches = train.numBatches();
        if (rank0) {
          System.out.printf("Train.java: GPT of %d parameters on %d ranks, %d batches per epoch%n",
              params, strategy.worldSize(), batches);
        }
        for (int i = 0; i < steps; ++i) {
          if (i > 0 && i % batches == 0) train.setEpoch(i / batches);
          StepResult r = strategy.trainingStep(train, i % batches, 1.0);
          if (rank0) System.out.printf("step %d loss %.4f grad_norm %.3f%n", r.step, r.loss, r.gradNorm);
        }
        double valLoss = strategy.validationStep(val, 0);
        if (rank0) System.out.printf("validation loss %.4f%n", valLoss);
      }
      if (ckptDir != null) {
        strategy.saveCheckpoint(ckptDir);
        if (rank0) System.out.println("checkpoint saved to " + ckptDir);
      }
    }
  }
}
