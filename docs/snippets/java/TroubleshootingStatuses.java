// generated from docs/troubleshooting.md by docs/snippets/extract.py; edit the page, not this file
import org.fsdp2.*;

public class TroubleshootingStatuses {
  public static void main(String[] args) {
    try {
      FSDP2Strategy.builder().set("data_paralel_size", 2).build();
      throw new AssertionError("expected FSDP2Exception");
    } catch (FSDP2Exception e) {
      if (e.status() != Status.INVALID_ARGUMENT) throw e;
      System.out.println(e.getMessage());
    }
    try (FSDP2Strategy s = FSDP2Strategy.builder().precision("fp32").build()) {
      s.parallelize(); // before setupEnvironment()
      throw new AssertionError("expected FSDP2Exception");
    } catch (FSDP2Exception e) {
      if (e.status() != Status.WRONG_ORDER) throw e;
      System.out.println(e.statusName());
    }
  }
}
