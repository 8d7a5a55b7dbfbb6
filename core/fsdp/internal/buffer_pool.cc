#include "core/fsdp/internal/buffer_pool.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

namespace fsdp2 {
namespace fsdp {
namespace internal {

struct BufferPool::Block {
  void* data;
  size_t nbytes;
};

BufferPool& BufferPool::Get() {
  static BufferPool* pool = new BufferPool();  // outlives every tensor
  return *pool;
}

at::DataPtr BufferPool::allocate(size_t nbytes) {
  if (nbytes < kMinPooledBytes) return c10::GetCPUAllocator()->allocate(nbytes);
  Block* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(nbytes);
    if (it != free_.end() && !it->second.empty()) {
      block = it->second.back();
      it->second.pop_back();
      ++stats_.reuses;
      stats_.kept_bytes -= static_cast<int64_t>(nbytes);
      stats_.in_use_bytes += static_cast<int64_t>(nbytes);
    }
  }
  if (block == nullptr) {
    block = new Block{c10::alloc_cpu(nbytes), nbytes};  // throws when out of memory
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.allocations;
    stats_.in_use_bytes += static_cast<int64_t>(nbytes);
  }
  return at::DataPtr(block->data, block, &BufferPool::Return, at::Device(at::kCPU));
}

void BufferPool::Return(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  BufferPool& pool = Get();
  std::lock_guard<std::mutex> lock(pool.mu_);
  pool.stats_.in_use_bytes -= static_cast<int64_t>(block->nbytes);
  pool.free_[block->nbytes].push_back(block);
  pool.stats_.kept_bytes += static_cast<int64_t>(block->nbytes);
}

at::DataPtr BufferPool::lend_largest_idle(size_t* nbytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
    if (it->second.empty()) continue;
    Block* block = it->second.back();
    it->second.pop_back();
    ++stats_.lent;
    stats_.kept_bytes -= static_cast<int64_t>(block->nbytes);
    stats_.in_use_bytes += static_cast<int64_t>(block->nbytes);
    *nbytes = block->nbytes;
    return at::DataPtr(block->data, block, &BufferPool::Return, at::Device(at::kCPU));
  }
  *nbytes = 0;
  return at::DataPtr();
}

at::Tensor BufferPool::empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.device().type() != at::kCPU) return at::empty(sizes, options);
  return at::detail::empty_generic(sizes, this, c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   c10::typeMetaToScalarType(options.dtype()),
                                   c10::nullopt);
}

void BufferPool::release() {
  std::map<size_t, std::vector<Block*>> kept;
  {
    std::lock_guard<std::mutex> lock(mu_);
    kept.swap(free_);
    stats_.kept_bytes = 0;
  }
  for (auto& [nbytes, blocks] : kept) {
    for (Block* block : blocks) {
      c10::free_cpu(block->data);
      delete block;
    }
  }
}

BufferPoolStats BufferPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2
