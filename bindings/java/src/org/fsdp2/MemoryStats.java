package org.fsdp2;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * What one rank holds in memory, in bytes, when {@link FSDP2Strategy#memoryStats()}
 * was called: the fields of the C {@code fsdp2_memory_stats_t}. An immutable
 * value; {@link #toMap()} gives the same numbers under the C (and Python)
 * names.
 */
public final class MemoryStats {
  /** This rank's parameter shards (all parameters on one rank or with NO_SHARD). */
  public final long shardedParamBytes;
  /** Their gradients (0 before a step). */
  public final long shardedGradBytes;
  /** The optimizer's state tensors on this rank (AdamW: twice the shards after a step). */
  public final long optimizerStateBytes;
  /**
   * Full-size parameter copies alive now that units compute with (gathered shards, or bf16
   * casts under mixed precision), in the compute dtype; 0 in fp32 on one rank or with NO_SHARD.
   */
  public final long unshardedParamBytes;
  /** Their high-water mark since parallelize or the last reset (process-wide). */
  public final long peakUnshardedParamBytes;
  /** Gradients kept unsharded now (accumulation without sync). */
  public final long unshardedGradBytes;
  /** The whole model's parameters, global and unsharded, in their dtype. */
  public final long totalParamBytes;
  /** The process's resident memory now (VmRSS). */
  public final long rssBytes;
  /** Its peak (VmHWM) since the process started or the last reset. */
  public final long peakRssBytes;
  /** On a GPU, bytes in tensors now (PyTorch's caching allocator); 0 on the CPU. */
  public final long deviceAllocatedBytes;
  /** On a GPU, bytes the allocator holds from the driver now; 0 on the CPU. */
  public final long deviceReservedBytes;
  /** Their peaks since parallelize or the last reset. */
  public final long peakDeviceAllocatedBytes;
  public final long peakDeviceReservedBytes;

  MemoryStats(long shardedParamBytes, long shardedGradBytes, long optimizerStateBytes,
      long unshardedParamBytes, long peakUnshardedParamBytes, long unshardedGradBytes,
      long totalParamBytes, long rssBytes, long peakRssBytes, long deviceAllocatedBytes,
      long deviceReservedBytes, long peakDeviceAllocatedBytes, long peakDeviceReservedBytes) {
    this.shardedParamBytes = shardedParamBytes;
    this.shardedGradBytes = shardedGradBytes;
    this.optimizerStateBytes = optimizerStateBytes;
    this.unshardedParamBytes = unshardedParamBytes;
    this.peakUnshardedParamBytes = peakUnshardedParamBytes;
    this.unshardedGradBytes = unshardedGradBytes;
    this.totalParamBytes = totalParamBytes;
    this.rssBytes = rssBytes;
    this.peakRssBytes = peakRssBytes;
    this.deviceAllocatedBytes = deviceAllocatedBytes;
    this.deviceReservedBytes = deviceReservedBytes;
    this.peakDeviceAllocatedBytes = peakDeviceAllocatedBytes;
    this.peakDeviceReservedBytes = peakDeviceReservedBytes;
  }

  /** The fields by their C names ("sharded_param_bytes", ...), in the C struct's order. */
  public Map<String, Long> toMap() {
    Map<String, Long> m = new LinkedHashMap<>();
    m.put("sharded_param_bytes", shardedParamBytes);
    m.put("sharded_grad_bytes", shardedGradBytes);
    m.put("optimizer_state_bytes", optimizerStateBytes);
    m.put("unsharded_param_bytes", unshardedParamBytes);
    m.put("peak_unsharded_param_bytes", peakUnshardedParamBytes);
    m.put("unsharded_grad_bytes", unshardedGradBytes);
    m.put("total_param_bytes", totalParamBytes);
    m.put("rss_bytes", rssBytes);
    m.put("peak_rss_bytes", peakRssBytes);
    m.put("device_allocated_bytes", deviceAllocatedBytes);
    m.put("device_reserved_bytes", deviceReservedBytes);
    m.put("peak_device_allocated_bytes", peakDeviceAllocatedBytes);
    m.put("peak_device_reserved_bytes", peakDeviceReservedBytes);
    return m;
  }

  @Override
  public String toString() {
    return "MemoryStats" + toMap();
  }
}
