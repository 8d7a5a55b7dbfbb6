// fsdp2/bench/train_rank.h
//
// What a rank of the speed benchmarks (//bench:train, //bench:matrix) runs,
// and PyTorch's DDP on the same model for comparison.
//
// A train rank builds the GPT, shards each block and then the root with the
// strategy asked for (or trains it without the engine, "single"), runs
// warm-up and timed steps of AdamW with clipping at 1.0 on fixed random
// batches, and has rank 0 write (bench_util WriteResult): the slowest rank's
// time of every timed step (step_s), median forward/backward/update times,
// each unit's exposed all-gather and reduction waits and copy-in time per
// step (unit), and the largest peak RSS over the ranks: of training
// (peak_rss_mib: the high-water mark restarts once the model is sharded and
// the optimizer built, since every rank first builds the whole model) and of
// the process (peak_process_mib, that build included).
#ifndef FSDP2_BENCH_TRAIN_RANK_H_
#define FSDP2_BENCH_TRAIN_RANK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/models/gpt.h"
#include "examples/flags/flags.h"

namespace fsdp2 {
namespace bench {

// The model and the global batch (sequences per step over all ranks).
struct ModelFlags {
  models::GPTConfig config;
  int64_t global_batch = 16;
};

// --n-layer ... --vocab-size and --global-batch, `defaults` where not given.
ModelFlags ReadModelFlags(flags::Flags& flags, const ModelFlags& defaults);
// Those flags with `m`'s values, for a rank's or python_ddp_gpt.py's command
// line.
std::vector<std::string> ModelArgs(const ModelFlags& m);

// Model FLOPs of one training step on `tokens` tokens: 6 per matmul weight
// per token (forward 2, backward 4; the tied head counts as a matmul) plus
// the attention scores and weighted sum (12 x layers x T x C per token).
double StepFlops(const models::GPTConfig& c, int64_t tokens);

// Rank roles. RunGemmRank writes gemm_gflops, the fp32 n x n matmul rate of
// this process's threads. RunTrainRank reads ReadModelFlags' flags and
// --strategy (single|full_shard|shard_grad_op|no_shard|hybrid_shard),
// --mixed-precision (fp32|bf16: bf16 all-gather and compute, fp32 master
// shards and reduction, as the main job's bf16), --steps and --warmup.
int RunGemmRank(flags::Flags& flags);
int RunTrainRank(flags::Flags& flags, const ModelFlags& defaults);

// PyTorch's own data parallelism (bench/python_ddp_gpt.py, gloo, its own
// allocator) on the same model and global batch, as `mode` says:
//   kDdp     DistributedDataParallel;
//   kNoComm  the ranks skip DDP and never exchange gradients: the fastest a
//            data-parallel step built from PyTorch's kernels can be on these
//            cores, the ceiling of engine / DDP;
//   kFsdp2   PyTorch's own FSDP2 (fully_shard per block and root, FULL_SHARD).
enum class PythonMode { kDdp, kNoComm, kFsdp2 };
struct PythonDdpResult {
  bool ok = false;
  double median_step_s = 0;  // the slowest rank's, median over steps
  double peak_rss_mib = 0;   // the largest over ranks
  std::string torch_version;
  std::string error;  // when !ok: the end of its output
};
PythonDdpResult RunPythonDdp(const ModelFlags& m, int nproc, int threads, bool bf16,
                             int steps, int warmup, PythonMode mode = PythonMode::kDdp);

// Whether the venv's python3 (FSDP2_PYTHON) can import torch.
bool PythonTorchAvailable();

}  // namespace bench
}  // namespace fsdp2

#endif  // FSDP2_BENCH_TRAIN_RANK_H_
