#include "c_api/internal/handles.h"

#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/common/error.h"

namespace fsdp2 {
namespace c_api {
namespace {

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kStrategy: return "fsdp2_strategy_t";
    case Kind::kModel: return "fsdp2_model_t";
    case Kind::kLoader: return "fsdp2_dataloader_t";
    case Kind::kUnshard: return "fsdp2_unshard_handle_t";
  }
  return "?";
}

class Registry {
 public:
  static Registry& Get() {
    static Registry* registry = new Registry();  // never destroyed: atexit-safe
    return *registry;
  }

  uintptr_t Add(Kind kind, std::shared_ptr<void> object) {
    std::lock_guard<std::mutex> lock(mu_);
    const uintptr_t id = next_id_;
    next_id_ += 16;  // looks like an aligned pointer; never reused
    entries_[id] = {kind, std::move(object)};
    return id;
  }

  std::shared_ptr<void> Find(uintptr_t id, Kind kind) {
    if (id == 0) throw InvalidHandleError(std::string(KindName(kind)) + " handle is NULL");
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      throw InvalidHandleError(std::string(KindName(kind)) +
                               " handle is not live: it was destroyed or never created");
    }
    if (it->second.first != kind) {
      throw InvalidHandleError(std::string("expected a ") + KindName(kind) + " handle, got a " +
                               KindName(it->second.first));
    }
    return it->second.second;
  }

  std::shared_ptr<void> Remove(uintptr_t id, Kind kind) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.first != kind) return nullptr;
    std::shared_ptr<void> object = std::move(it->second.second);
    entries_.erase(it);
    return object;
  }

 private:
  std::mutex mu_;
  uintptr_t next_id_ = 0x10000;
  std::unordered_map<uintptr_t, std::pair<Kind, std::shared_ptr<void>>> entries_;
};

}  // namespace

uintptr_t AddHandle(Kind kind, std::shared_ptr<void> object) {
  return Registry::Get().Add(kind, std::move(object));
}

std::shared_ptr<void> FindHandle(uintptr_t id, Kind kind) {
  return Registry::Get().Find(id, kind);
}

std::shared_ptr<void> RemoveHandle(uintptr_t id, Kind kind) {
  return Registry::Get().Remove(id, kind);
}

void RequireParallelized(const StrategyState& s, const char* what) {
  if (!s.strategy->parallelized()) {
    throw FailedPreconditionError(std::string(what) +
                                  ": call fsdp2_strategy_connect and fsdp2_strategy_parallelize first");
  }
}

}  // namespace c_api
}  // namespace fsdp2
