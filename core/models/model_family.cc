#include "core/models/model_family.h"

#include <ATen/ATen.h>

#include <sstream>

#include "core/common/error.h"

namespace fsdp2 {
namespace models {

std::unique_ptr<torch::optim::Optimizer> ModelFamily::configure_optimizers() {
  // Frozen parameters (frozen_params) get no optimizer state.
  std::vector<at::Tensor> trained;
  for (const at::Tensor& p : module()->parameters()) {
    if (p.requires_grad()) trained.push_back(p);
  }
  if (trained.empty()) {
    throw InvalidArgumentError("every parameter of the model is frozen (frozen_params): nothing "
                               "to train");
  }
  return strategy::MakeOptimizer(trained, optimizer_);
}

std::string DescribeTensor(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes() << " " << t.dtype();
  return s.str();
}

void RequireBatchTensors(const strategy::Batch& batch, size_t n, const char* what) {
  if (batch.size() < n) {
    throw ShapeError("the batch has " + std::to_string(batch.size()) +
                     " tensor(s); this model needs " + what);
  }
}

bool IsIntegerTensor(const at::Tensor& t) {
  return t.scalar_type() == at::kLong || t.scalar_type() == at::kInt ||
         t.scalar_type() == at::kByte;
}

}  // namespace models
}  // namespace fsdp2
