#include "core/comm/backend.h"

#include "core/common/enum_names.h"
#include "core/common/error.h"

namespace fsdp2 {
namespace comm {

const std::vector<Backend>& AllBackends() {
  static const std::vector<Backend> all = {Backend::kGloo, Backend::kNccl};
  return all;
}

const char* ToString(Backend backend) {
  switch (backend) {
    case Backend::kGloo: return "gloo";
    case Backend::kNccl: return "nccl";
  }
  return "?";
}

Backend ParseBackend(const std::string& name) {
  return ParseEnumName(name, AllBackends(), [](Backend b) { return ToString(b); }, "backend");
}

void RequireBuilt(Backend backend) {
#ifndef USE_C10D_NCCL
  if (backend == Backend::kNccl) {
    throw InvalidArgumentError(
        "fsdp2: backend 'nccl' needs a CUDA build of LibTorch; this build has only gloo");
  }
#else
  (void)backend;
#endif
}

}  // namespace comm
}  // namespace fsdp2
