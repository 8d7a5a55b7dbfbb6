#include "core/checkpoint/internal/shared_error.h"

#include <ATen/ATen.h>

#include "core/common/error.h"

namespace fsdp2 {
namespace checkpoint {
namespace internal {

std::optional<int> FailedRank(const std::string& error, comm::World& world) {
  // 1 + the rank where it failed, 0 where not: the maximum names the last.
  at::Tensor failed = at::full({1}, error.empty() ? 0.0 : 1.0 + world.rank(), at::kDouble);
  world.group()->all_reduce(failed, comm::ReduceOp::kMax).wait();
  const int last = static_cast<int>(failed.item<double>());
  if (last == 0) return std::nullopt;
  return last - 1;
}

void ThrowIfAnyRankFailed(const std::string& error, comm::World& world,
                          const std::string& other_ranks_error) {
  if (FailedRank(error, world)) throw IoError(error.empty() ? other_ranks_error : error);
}

void ShareRank0Error(const std::string& error, comm::World& world,
                     const std::string& other_ranks_error) {
  at::Tensor failed = at::full({1}, error.empty() ? 0.0 : 1.0, at::kDouble);
  world.group()->broadcast(failed, 0).wait();
  if (failed.item<double>() != 0) {
    throw IoError(world.rank() == 0 ? error : other_ranks_error);
  }
}

}  // namespace internal
}  // namespace checkpoint
}  // namespace fsdp2
