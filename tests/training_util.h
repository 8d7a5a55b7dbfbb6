// fsdp2/tests/training_util.h
//
// What the tests share below the strategy layer: the small models,
// data and optimizers they train (fixtures), checks for scenarios, and one
// training recipe run two ways: unsharded in one process on the global
// batch (the reference), and as one rank of an FSDP run on its slice of the
// same global batch. Equivalence tests compare the two.
//
// Data: for step s the global batch has world * batch_per_rank * grad_accum
// rows drawn from a generator seeded by (seed, s). Micro-batch j of rank r is
// rows [(j * world + r) * B, +B). The reference trains on all rows at once,
// so gradient accumulation is checked against one batch k times the size.
#ifndef FSDP2_TESTS_TRAINING_UTIL_H_
#define FSDP2_TESTS_TRAINING_UTIL_H_

#include <torch/nn/module.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/world.h"
#include "core/fsdp/fully_shard.h"
#include "core/models/gpt.h"
#include "core/strategy/optimizer.h"

namespace fsdp2 {
namespace testing {

// ------------------------------------------------------------ fixtures

// The tests' GPT: vocabulary 32, 8 tokens, 2 blocks of 2 heads, n_embd 16.
// A test that needs other sizes changes the fields it names.
models::GPTConfig TinyGPT();

// `rows` windows of 9 random tokens below `vocab_size` (generator seed 99):
// {inputs [rows, 8], targets [rows, 8]}, the targets shifted by one.
std::vector<at::Tensor> TokenWindows(int64_t vocab_size, int64_t rows);

// The tests' optimizers: "adamw" (lr 1e-2, weight decay 0.01), "adam"
// (lr 1e-2, no weight decay) or "sgd" (lr 0.1, momentum 0.9).
strategy::OptimizerOptions TestOptimizer(const std::string& kind);

// FSDP options over a one-dimensional "dp" mesh of the whole world.
fsdp::FSDPOptions DataParallelOptions(const std::shared_ptr<comm::World>& world);

// In a scenario: throws std::runtime_error("FAILED: what") unless `ok`.
void Check(bool ok, const std::string& what);

// In a scenario: runs `fn` and throws std::runtime_error unless it throws
// an E whose message contains `needle`.
template <typename E, typename F>
void ExpectThrows(const std::string& what, const std::string& needle, F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    Check(std::string(e.what()).find(needle) != std::string::npos,
          what + ": message '" + e.what() + "' lacks '" + needle + "'");
    return;
  } catch (const std::exception& e) {
    throw std::runtime_error("FAILED: " + what + ": wrong exception type: " + e.what());
  }
  throw std::runtime_error("FAILED: " + what + ": did not throw");
}

// ------------------------------------------- fully_shard against one process

struct TrainSpec {
  std::string model = "gpt";         // gpt | mlp | conv
  std::string strategy = "full_shard";
  int steps = 10;
  int64_t batch_per_rank = 2;
  std::string dtype = "float64";     // float64 | float32
  std::string mixed_precision = "none";  // none | bf16
  int grad_accum = 1;
  double clip = 0;                   // max grad norm; 0 = no clipping
  uint64_t seed = 7;
  std::string optimizer = "adamw";   // adamw | adam | sgd (momentum 0.9)
  // Activation checkpointing: none | full | selective (every ac_every-th
  // unit that contains no other unit; the reference checkpoints the same
  // modules), and the GPT's dropout.
  std::string ac = "none";
  int ac_every = 2;
  double dropout = 0;
  // fully_shard's controls, comma-separated (empty: the defaults):
  //   rs      accumulate by reduce-scattering every micro-batch, the
  //           all-reduce across replicas only at the last
  //           (set_requires_all_reduce) instead of no-sync
  //   fp=D    forward_prefetch D;  bp=D  backward_prefetch D
  //   raf=K   reshard_after_forward_size K
  //   div=F   gradient_divide_factor F (the reference scales its loss by
  //           world / F, which gives the same gradients)
  //   ignore=NAME  the parameter NAME is in ignored_params: each rank keeps
  //           it whole and all-reduces its gradient itself (the mean, or
  //           the sum / F with div) after the last micro-batch
  //   fl=U:V+W  unit U's explicit forward prefetch list is units V, W
  //           (fsdp::set_modules_to_forward_prefetch; units by index in
  //           the model's inner units, r the root; "fl=0:" an empty list);
  //           bl=U:V+W  the same for backward. Repeat for more units.
  std::string controls;

  std::vector<std::string> ToArgs() const;
  static TrainSpec FromArgs(const std::vector<std::string>& args);
  std::string Name() const;
};

struct TrainOutput {
  std::vector<double> losses;      // global mean loss per step
  std::vector<double> grad_norms;  // per step, when clipping
  std::vector<std::pair<std::string, at::Tensor>> params;  // full, at the end
  fsdp::MemoryStats stats;  // after the last optimizer step (sharded runs)
  int64_t peak_unsharded_bytes = 0;
  // Per unit (the inner units in module order, then the root): all-gathers
  // and gradient reductions over the whole run (sharded runs).
  std::vector<int64_t> all_gathers, reductions;
  // Per unit, in the same order: its unsharded parameter bytes right after
  // the first forward, before its backward (sharded runs).
  std::vector<int64_t> after_forward_unsharded;
};

// The reference: one process, no FSDP, the global batch of `world` ranks.
TrainOutput TrainReference(const TrainSpec& spec, int world);

// One rank of an FSDP run; every rank returns the full parameters.
TrainOutput TrainSharded(const TrainSpec& spec,
                         const std::shared_ptr<comm::World>& world);

void WriteOutput(const std::string& path, const TrainOutput& out);
TrainOutput ReadOutput(const std::string& path);

// Largest |a - b| / max(|b|, floor) over the losses.
double MaxLossRelDiff(const TrainOutput& a, const TrainOutput& b, double floor);
// Largest |a - b| / max(|a|, |b|, floor) over all parameter elements.
double MaxParamRelDiff(const TrainOutput& a, const TrainOutput& b, double floor);
// Largest |a - b| over all parameter elements (same names required); the
// parameter where it occurs goes to `where` when given.
double MaxParamAbsDiff(const TrainOutput& a, const TrainOutput& b,
                       std::string* where = nullptr);

}  // namespace testing
}  // namespace fsdp2

#endif  // FSDP2_TESTS_TRAINING_UTIL_H_
