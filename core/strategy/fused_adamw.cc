#include "core/strategy/fused_adamw.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace fsdp2 {
namespace strategy {
namespace {

// The scalars of one parameter's update, in its dtype, as LibTorch's AdamW
// hands them to ATen's kernels.
template <typename T>
struct Coefficients {
  bool decay;     // weight decay on
  T decay_factor; // 1 - lr * weight_decay
  T beta1, one_minus_beta1, beta2, one_minus_beta2;
  T sqrt_bias_correction2, eps, neg_step_size;
};

// One element at a time, the operations of torch::optim::AdamW::step in
// its order, up to the square root: p *= 1 - lr * wd; m = m * b1, then
// m += (1 - b1) * g (ATen's add kernel: a fused multiply-add on CPUs with
// FMA, separate roundings without); v = v * b2, then v += (1 - b2) * g * g.
template <typename T, bool kFused>
inline void MomentsRange(T* p, const T* g, T* m, T* v, int64_t begin, int64_t end,
                         const Coefficients<T>& c) {
  for (int64_t i = begin; i < end; ++i) {
    if (c.decay) p[i] = p[i] * c.decay_factor;
    const T gi = g[i];
    const T m_scaled = m[i] * c.beta1;
    if constexpr (kFused) {
      m[i] = std::fma(gi, c.one_minus_beta1, m_scaled);
    } else {
      const T term = c.one_minus_beta1 * gi;
      m[i] = m_scaled + term;
    }
    const T v_scaled = v[i] * c.beta2;
    const T scaled_g = c.one_minus_beta2 * gi;
    if constexpr (kFused) {
      v[i] = std::fma(scaled_g, gi, v_scaled);
    } else {
      const T square_term = scaled_g * gi;
      v[i] = v_scaled + square_term;
    }
  }
}

// The rest, from root = sqrt(v) (ATen's): denom = root / sqrt(bc2) + eps;
// p += (-step_size * m) / denom.
template <typename T>
inline void ApplyRange(T* p, const T* m, const T* root, int64_t begin, int64_t end,
                       const Coefficients<T>& c) {
  for (int64_t i = begin; i < end; ++i) {
    const T denom = root[i - begin] / c.sqrt_bias_correction2 + c.eps;
    const T numerator = c.neg_step_size * m[i];
    p[i] = p[i] + numerator / denom;
  }
}

#if defined(__x86_64__) || defined(__i386__)
// Hardware FMA for the fused variant: compiled for AVX2+FMA and chosen at
// run time, so the library still runs on CPUs without it.
template <typename T>
__attribute__((target("avx2,fma"))) void MomentsFma(T* p, const T* g, T* m, T* v,
                                                    int64_t begin, int64_t end,
                                                    const Coefficients<T>& c) {
  MomentsRange<T, true>(p, g, m, v, begin, end, c);
}

// Whether ATen's CPU kernels run with FMA here: it picks its AVX2 or
// AVX-512 kernels (whose add uses fmadd) on CPUs with AVX2 and FMA, unless
// ATEN_CPU_CAPABILITY=default asks for the plain ones.
bool AtenUsesFma() {
  static const bool fma = [] {
    const char* capability = std::getenv("ATEN_CPU_CAPABILITY");
    if (capability != nullptr && std::string(capability) == "default") return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return fma;
}
#else
// Other architectures: the plain variant (not checked against ATen there).
template <typename T>
void MomentsFma(T* p, const T* g, T* m, T* v, int64_t begin, int64_t end,
                const Coefficients<T>& c) {
  MomentsRange<T, false>(p, g, m, v, begin, end, c);
}
bool AtenUsesFma() { return false; }
#endif

template <typename T>
void Update(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v,
            const Coefficients<T>& c) {
  T* pp = p.data_ptr<T>();
  const T* gp = g.data_ptr<T>();
  T* mp = m.data_ptr<T>();
  T* vp = v.data_ptr<T>();
  const bool fma = AtenUsesFma();
  const at::Tensor v_flat = v.view(-1);
  constexpr int64_t kBlock = int64_t{1} << 15;  // elements; a block's v stays in cache
  at::parallel_for(0, p.numel(), kBlock, [&](int64_t begin, int64_t end) {
    at::Tensor root = at::empty({std::min(kBlock, end - begin)}, v.options());
    for (int64_t b = begin; b < end; b += kBlock) {
      const int64_t e = std::min(end, b + kBlock);
      if (fma) {
        MomentsFma<T>(pp, gp, mp, vp, b, e, c);
      } else {
        MomentsRange<T, false>(pp, gp, mp, vp, b, e, c);
      }
      // ATen's square root, not std::sqrt: PyTorch's wheels take it from
      // MKL's vector math, which is not correctly rounded (20% of fp32
      // results differ from std::sqrt in the last bit), and LibTorch's
      // AdamW uses it.
      at::Tensor r = root.narrow(0, 0, e - b);
      at::sqrt_out(r, v_flat.narrow(0, b, e - b));
      ApplyRange<T>(pp, mp, r.data_ptr<T>(), b, e, c);
    }
  });
}

// Whether `t` is a dense contiguous CPU tensor of `p`'s dtype and size.
bool Alike(const at::Tensor& t, const at::Tensor& p) {
  return t.device().is_cpu() && !t.is_sparse() && t.scalar_type() == p.scalar_type() &&
         t.is_contiguous() && t.numel() == p.numel();
}

// Whether `t` is a dense contiguous CUDA tensor of `p`'s dtype, size and device.
bool AlikeOnGpu(const at::Tensor& t, const at::Tensor& p) {
  return t.is_cuda() && !t.is_sparse() && t.device() == p.device() &&
         t.scalar_type() == p.scalar_type() && t.is_contiguous() && t.numel() == p.numel();
}

}  // namespace

torch::optim::AdamWParamState& FusedAdamW::state_of(const at::Tensor& p) {
  void* const key = p.unsafeGetTensorImpl();
  auto found = state_.find(key);
  if (found == state_.end()) {
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(0);
    state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    found = state_.emplace(key, std::move(state)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*found->second);
}

bool FusedAdamW::step_on_gpu() {
  bool any = false;
  for (const auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (const at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!p.is_cuda()) return false;
      any = true;
      const auto type = p.scalar_type();
      if (options.amsgrad() ||
          (type != at::kFloat && type != at::kDouble && type != at::kHalf &&
           type != at::kBFloat16) ||
          !AlikeOnGpu(p, p) || !AlikeOnGpu(p.grad(), p)) {
        return false;
      }
      auto found = state_.find(p.unsafeGetTensorImpl());
      if (found != state_.end()) {
        const auto& state = static_cast<const torch::optim::AdamWParamState&>(*found->second);
        if (!AlikeOnGpu(state.exp_avg(), p) || !AlikeOnGpu(state.exp_avg_sq(), p)) return false;
      }
    }
  }
  if (!any) return false;
  at::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    // PyTorch's fused kernel takes lists of one device and dtype, and the
    // step of each parameter as a tensor: one batch per (device, dtype,
    // step), which is one batch in all when every parameter has stepped
    // alike.
    struct Lists {
      std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    };
    std::map<std::tuple<int, int, int64_t>, Lists> batches;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& state = state_of(p);
      state.step(state.step() + 1);
      Lists& b = batches[{p.device().index(), static_cast<int>(p.scalar_type()), state.step()}];
      b.params.push_back(p);
      b.grads.push_back(p.grad());
      b.exp_avgs.push_back(state.exp_avg());
      b.exp_avg_sqs.push_back(state.exp_avg_sq());
    }
    for (auto& [key, b] : batches) {
      const at::Tensor step = at::full({}, static_cast<double>(std::get<2>(key)),
                                       b.params[0].options().dtype(at::kFloat));
      const std::vector<at::Tensor> steps(b.params.size(), step);
      at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, /*max_exp_avg_sqs=*/{},
                        steps, options.lr(), std::get<0>(options.betas()),
                        std::get<1>(options.betas()), options.weight_decay(), options.eps(),
                        /*amsgrad=*/false, /*maximize=*/false);
    }
  }
  return true;
}

at::Tensor FusedAdamW::step(LossClosure closure) {
  if (closure == nullptr && step_on_gpu()) return at::Tensor();
  // LibTorch's own step wherever the one-pass update does not apply.
  for (const auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    if (options.amsgrad()) return torch::optim::AdamW::step(std::move(closure));
    for (const at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto type = p.scalar_type();
      bool fusable = (type == at::kFloat || type == at::kDouble) && Alike(p, p) &&
                     Alike(p.grad(), p);
      auto found = state_.find(p.unsafeGetTensorImpl());
      if (fusable && found != state_.end()) {  // a state loaded in another layout
        const auto& state = static_cast<const torch::optim::AdamWParamState&>(*found->second);
        fusable = Alike(state.exp_avg(), p) && Alike(state.exp_avg_sq(), p);
      }
      if (!fusable) return torch::optim::AdamW::step(std::move(closure));
    }
  }
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = p.grad();
      auto& state = state_of(p);
      at::Tensor& exp_avg = state.exp_avg();
      at::Tensor& exp_avg_sq = state.exp_avg_sq();
      state.step(state.step() + 1);
      const double beta1 = std::get<0>(options.betas());
      const double beta2 = std::get<1>(options.betas());
      const double bias_correction1 = 1 - std::pow(beta1, state.step());
      const double bias_correction2 = 1 - std::pow(beta2, state.step());
      const double step_size = options.lr() / bias_correction1;
      if (p.scalar_type() == at::kFloat) {
        Coefficients<float> c{options.weight_decay() != 0,
                              static_cast<float>(1 - options.lr() * options.weight_decay()),
                              static_cast<float>(beta1),
                              static_cast<float>(1 - beta1),
                              static_cast<float>(beta2),
                              static_cast<float>(1 - beta2),
                              static_cast<float>(std::sqrt(bias_correction2)),
                              static_cast<float>(options.eps()),
                              static_cast<float>(-step_size)};
        Update<float>(p, grad, exp_avg, exp_avg_sq, c);
      } else {
        Coefficients<double> c{options.weight_decay() != 0,
                               1 - options.lr() * options.weight_decay(),
                               beta1,
                               1 - beta1,
                               beta2,
                               1 - beta2,
                               std::sqrt(bias_correction2),
                               options.eps(),
                               -step_size};
        Update<double>(p, grad, exp_avg, exp_avg_sq, c);
      }
    }
  }
  return loss;
}

}  // namespace strategy
}  // namespace fsdp2
