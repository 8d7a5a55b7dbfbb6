#include "core/strategy/lazy_zero_grad.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/strategy/optimizer.h"

namespace fsdp2 {
namespace strategy {
namespace {

// Two parameters; `b` gets no gradient in steps 1 and 3 (a branch not
// taken), and every step accumulates two backward passes.
struct Training {
  at::Tensor a, b;
  std::unique_ptr<torch::optim::Optimizer> opt;
  explicit Training(OptimizerKind kind) {
    a = at::linspace(-1, 1, 7, at::kDouble).requires_grad_();
    b = at::linspace(0.5, 2, 5, at::kDouble).requires_grad_();
    OptimizerOptions o;
    o.kind = kind;
    o.lr = 0.1;
    o.weight_decay = 0.1;
    o.momentum = 0.9;
    opt = MakeOptimizer({a, b}, o);
  }
  void backward(int step) {
    for (int micro = 0; micro < 2; ++micro) {
      at::Tensor loss = (a * a).sum() * (1 + micro);
      if (step % 2 == 0) loss = loss + (b.sin() * (step + 1)).sum();
      loss.backward();
    }
  }
};

void ExpectSame(const Training& x, const Training& y, int step) {
  EXPECT_TRUE(at::equal(x.a, y.a)) << "step " << step;
  EXPECT_TRUE(at::equal(x.b, y.b)) << "step " << step;
}

TEST(LazyZeroGrad, StepsExactlyAsInPlaceZeroing) {
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSGD}) {
    SCOPED_TRACE(ToString(kind));
    Training in_place(kind), lazy(kind);
    LazyZeroGrad zero;
    for (int step = 0; step < 5; ++step) {
      in_place.backward(step);
      lazy.backward(step);
      zero.materialize();
      in_place.opt->step();
      lazy.opt->step();
      ExpectSame(in_place, lazy, step);
      in_place.opt->zero_grad(/*set_to_none=*/false);
      zero.zero_grad(*lazy.opt);
      // Freed, not kept as zeros.
      EXPECT_FALSE(lazy.a.grad().defined());
      EXPECT_FALSE(lazy.b.grad().defined());
    }
    // The steps without b's gradient moved b: a zero gradient still decays
    // it, where a freed one would be skipped.
    Training none(kind);
    for (int step = 0; step < 2; ++step) {
      none.backward(step);
      none.opt->step();
      for (at::Tensor& p : none.opt->param_groups()[0].params()) p.mutable_grad() = at::Tensor();
    }
    Training lazy2(kind);
    LazyZeroGrad zero2;
    for (int step = 0; step < 2; ++step) {
      lazy2.backward(step);
      zero2.materialize();
      lazy2.opt->step();
      zero2.zero_grad(*lazy2.opt);
    }
    EXPECT_FALSE(at::equal(none.b, lazy2.b)) << "the test cannot tell lazy zeros from none";
  }
}

TEST(LazyZeroGrad, MaterializesOnlyWhatGotNoGradient) {
  Training run(OptimizerKind::kAdamW);
  LazyZeroGrad zero;
  zero.zero_grad(*run.opt);  // nothing has a gradient yet
  EXPECT_EQ(zero.pending(), 0u);
  run.backward(0);
  run.opt->step();
  zero.zero_grad(*run.opt);
  EXPECT_EQ(zero.pending(), 2u);
  run.backward(1);  // a only
  EXPECT_EQ(zero.pending(), 1u);
  const at::Tensor a_grad = run.a.grad();
  zero.materialize();
  EXPECT_TRUE(run.a.grad().is_same(a_grad)) << "a's own gradient was replaced";
  ASSERT_TRUE(run.b.grad().defined());
  EXPECT_TRUE(at::equal(run.b.grad(), at::zeros_like(run.b)));
  EXPECT_EQ(zero.pending(), 0u);
  // Zeroing twice without a step in between frees each once.
  zero.zero_grad(*run.opt);
  zero.zero_grad(*run.opt);
  EXPECT_EQ(zero.pending(), 2u);
  run.backward(2);
  zero.zero_grad(*run.opt);
  EXPECT_EQ(zero.pending(), 2u);
}

// CPU offload steps one unit at a time: materialize and zero_grad over
// parts of the parameters, each part in turn, step as over all of them.
TEST(LazyZeroGrad, PartByPartStepsAsTheWhole) {
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSGD}) {
    SCOPED_TRACE(ToString(kind));
    Training whole(kind), parts(kind);
    LazyZeroGrad zero_whole, zero_parts;
    for (int step = 0; step < 5; ++step) {
      whole.backward(step);
      parts.backward(step);
      zero_whole.materialize();
      whole.opt->step();
      zero_whole.zero_grad(*whole.opt);
      for (const at::Tensor& p : {parts.b, parts.a}) {  // backward order: b first
        zero_parts.materialize({p});
        // The optimizer over this part alone, as HostOptimizer steps it.
        auto& group = parts.opt->param_groups()[0];
        std::vector<at::Tensor> all = group.params();
        group.params() = {p};
        parts.opt->step();
        group.params() = all;
        zero_parts.zero_grad({p});
        EXPECT_FALSE(p.grad().defined());
      }
      zero_parts.zero_grad(*parts.opt);  // nothing left to free
      ExpectSame(whole, parts, step);
      EXPECT_EQ(zero_whole.pending(), zero_parts.pending()) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace strategy
}  // namespace fsdp2
