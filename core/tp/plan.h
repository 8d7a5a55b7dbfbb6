// fsdp2/core/tp/plan.h
//
// The vocabulary of a tensor-parallel plan: how one torch::nn::Linear or
// torch::nn::Embedding is split over the ranks of a tensor-parallel group
// (ParallelStyle), which modules of a model get which style
// (TensorParallelPlan), and the interface a model implements to say what its
// plan is (TensorParallelPlanProvider), as Hugging Face models carry a
// `_tp_plan` that NeMo's FSDP2 strategy reads.
//
// Styles (tp = group size, r = this rank):
//  Linear, column-wise: weight rows (output features) and bias split into tp
//    equal blocks, rank r keeps block r. The input is replicated (its
//    gradient is all-reduced in backward); the output is this rank's
//    features, or all of them when gather_output (all-gathered forward,
//    sliced backward). fused_parts > 1 splits each of that many equal row
//    blocks separately (a fused q,k,v projection: fused_parts = 3), so rank r
//    holds its part of q, of k and of v.
//  Linear, row-wise: weight columns (input features) split; the bias is
//    replicated. The input is this rank's features (the sharded output of a
//    column-wise layer; input_is_sharded = false slices a replicated input
//    here); the partial outputs are all-reduced in forward, then the bias is
//    added once.
//  Embedding, row-wise (vocab-parallel): rank r keeps a block of the rows
//    (token ids); ids outside it give zeros, and the outputs are all-reduced.
//  Embedding, column-wise: rank r keeps a block of the embedding dims; the
//    output is that block, or all dims when gather_output.
// Every split must be even: the size split must be a multiple of tp.
#ifndef FSDP2_CORE_TP_PLAN_H_
#define FSDP2_CORE_TP_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp2 {
namespace tp {

// How one Linear or Embedding is split over the tensor-parallel group (the
// styles above). Build it with Colwise() or Rowwise().
struct ParallelStyle {
  // Which dimension is split: column-wise (output features; an Embedding's
  // dims) or row-wise (input features; an Embedding's vocabulary rows).
  enum class Kind { kColwise, kRowwise };
  Kind kind = Kind::kColwise;  // default: column-wise
  bool gather_output = false;    // column-wise only
  bool input_is_sharded = true;  // row-wise Linear only
  int64_t fused_parts = 1;       // column-wise Linear only

  // Column-wise; gather_output all-gathers the output features (default:
  // each rank keeps its block); fused_parts splits that many fused row
  // blocks separately (Linear only; default 1: not fused).
  static ParallelStyle Colwise(bool gather_output = false,
                               int64_t fused_parts = 1) {
    ParallelStyle s;
    s.kind = Kind::kColwise;
    s.gather_output = gather_output;
    s.fused_parts = fused_parts;
    return s;
  }
  // Row-wise; input_is_sharded false makes a Linear slice a replicated input
  // itself (default true: the input is a column-wise layer's sharded output).
  static ParallelStyle Rowwise(bool input_is_sharded = true) {
    ParallelStyle s;
    s.kind = Kind::kRowwise;
    s.input_is_sharded = input_is_sharded;
    return s;
  }
  // For messages, e.g. "Colwise(gather_output=0, fused_parts=3)" or
  // "Rowwise(input_is_sharded=1)".
  std::string ToString() const;
};

// `pattern` names a module by its path from the root, as named_modules()
// names it ("blocks.0.attn.qkv"); a "*" component matches any one component
// ("blocks.*.attn.qkv").
struct PlanEntry {
  std::string pattern;  // the module path, "*" for any one component
  ParallelStyle style;  // how every module it matches is split
};
// A model's plan: every entry must match at least one module
// (parallelize_module throws otherwise); modules no entry matches stay
// replicated over the tensor-parallel ranks.
using TensorParallelPlan = std::vector<PlanEntry>;

// Implemented by models that can be tensor-parallel (alongside
// torch::nn::Module). The default parallelize function of FSDP2Strategy
// asks the model for its plan when tensor_parallel_size > 1.
class TensorParallelPlanProvider {
 public:
  virtual ~TensorParallelPlanProvider() = default;
  // The plan for `tp_size` ranks. Throws std::invalid_argument, saying what
  // to change, when the model cannot be split that many ways.
  virtual TensorParallelPlan tensor_parallel_plan(int tp_size) const = 0;
};

}  // namespace tp
}  // namespace fsdp2

#endif  // FSDP2_CORE_TP_PLAN_H_
