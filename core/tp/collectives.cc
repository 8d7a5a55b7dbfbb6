#include "core/tp/collectives.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>
#include <string>

namespace fsdp2 {
namespace tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool Trivial(const std::shared_ptr<comm::ProcessGroup>& group) {
  return !group || group->size() == 1;
}

// The group travels through the autograd context as an address; the caller
// keeps it alive (see the header).
int64_t Address(const std::shared_ptr<comm::ProcessGroup>& group) {
  return reinterpret_cast<int64_t>(group.get());
}
comm::ProcessGroup& GroupAt(AutogradContext* ctx) {
  return *reinterpret_cast<comm::ProcessGroup*>(ctx->saved_data["group"].toInt());
}

at::Tensor AllReduced(const at::Tensor& x, comm::ProcessGroup& group) {
  at::Tensor out = x.detach().contiguous().clone();
  group.all_reduce(out).wait();
  return out;
}

int64_t WrapDim(int64_t dim, const at::Tensor& x) {
  const int64_t n = x.dim();
  if (dim < -n || dim >= n) {
    throw InvalidArgumentError("tensor parallel: dim " + std::to_string(dim) +
                                " is out of range for a tensor of " +
                                std::to_string(n) + " dims");
  }
  return dim < 0 ? dim + n : dim;
}

at::Tensor OwnSlice(const at::Tensor& x, comm::ProcessGroup& group, int64_t dim) {
  const int64_t size = x.size(dim);
  if (size % group.size() != 0) {
    throw InvalidArgumentError(
        "tensor parallel: cannot split size " + std::to_string(size) +
        " of dim " + std::to_string(dim) + " evenly over " +
        std::to_string(group.size()) + " tensor-parallel ranks; make it a "
        "multiple of tensor_parallel_size");
  }
  const int64_t chunk = size / group.size();
  return x.narrow(dim, group.rank() * chunk, chunk);
}

struct CopyToTensorParallel : torch::autograd::Function<CopyToTensorParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            int64_t group) {
    ctx->saved_data["group"] = group;
    return x;  // an input returned as is becomes an identity view
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {AllReduced(grads[0], GroupAt(ctx)), at::Tensor()};
  }
};

struct ReduceFromTensorParallel
    : torch::autograd::Function<ReduceFromTensorParallel> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x,
                            int64_t group) {
    return AllReduced(x, *reinterpret_cast<comm::ProcessGroup*>(group));
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

struct GatherFromTensorParallel
    : torch::autograd::Function<GatherFromTensorParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            int64_t group, int64_t dim) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    return all_gather_along(x, *reinterpret_cast<comm::ProcessGroup*>(group), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {OwnSlice(grads[0], GroupAt(ctx), dim).contiguous(), at::Tensor(),
            at::Tensor()};
  }
};

struct ScatterToTensorParallel
    : torch::autograd::Function<ScatterToTensorParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            int64_t group, int64_t dim) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    // A copy: a slice along dim 0 would otherwise be a view of the input.
    return OwnSlice(x, *reinterpret_cast<comm::ProcessGroup*>(group), dim)
        .clone(at::MemoryFormat::Contiguous);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {all_gather_along(grads[0], GroupAt(ctx), dim), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor all_gather_along(const at::Tensor& x, comm::ProcessGroup& group,
                            int64_t dim) {
  dim = WrapDim(dim, x);
  const int64_t world = group.size();
  at::Tensor input = x.detach().contiguous();
  at::Tensor flat = at::empty({world * input.numel()}, input.options());
  group.all_gather_into_flat(flat, input.reshape({-1})).wait();
  // [world, *x.shape] -> move the rank axis next to `dim`, then merge them.
  std::vector<int64_t> stacked{world};
  for (int64_t d : input.sizes()) stacked.push_back(d);
  at::Tensor parts = flat.view(stacked).movedim(0, dim);
  std::vector<int64_t> shape = input.sizes().vec();
  shape[dim] *= world;
  return parts.reshape(shape);
}

at::Tensor copy_to_tensor_parallel(
    const at::Tensor& x, const std::shared_ptr<comm::ProcessGroup>& group) {
  if (Trivial(group)) return x;
  return CopyToTensorParallel::apply(x, Address(group));
}

at::Tensor reduce_from_tensor_parallel(
    const at::Tensor& x, const std::shared_ptr<comm::ProcessGroup>& group) {
  if (Trivial(group)) return x;
  return ReduceFromTensorParallel::apply(x, Address(group));
}

at::Tensor gather_from_tensor_parallel(
    const at::Tensor& x, const std::shared_ptr<comm::ProcessGroup>& group,
    int64_t dim) {
  dim = WrapDim(dim, x);
  if (Trivial(group)) return x;
  return GatherFromTensorParallel::apply(x, Address(group), dim);
}

at::Tensor scatter_to_tensor_parallel(
    const at::Tensor& x, const std::shared_ptr<comm::ProcessGroup>& group,
    int64_t dim) {
  dim = WrapDim(dim, x);
  if (Trivial(group)) return x;
  return ScatterToTensorParallel::apply(x, Address(group), dim);
}

}  // namespace tp
}  // namespace fsdp2
