// fsdp2/core/comm/backend.h
//
// The communication library of a job's process groups, as a typed value:
// front ends parse its name once, at their edge (the option table of
// core/strategy, the FSDP2_BACKEND variable), and core/comm never compares
// names.
#ifndef FSDP2_CORE_COMM_BACKEND_H_
#define FSDP2_CORE_COMM_BACKEND_H_

#include <string>
#include <vector>

namespace fsdp2 {
namespace comm {

// Which library moves a group's bytes between ranks.
enum class Backend {
  kGloo,  // Gloo (and shared memory on one host); device tensors staged through host memory
  kNccl,  // NCCL: one GPU per rank; CUDA builds only
};

// Every backend, in the order of the C ABI's fsdp2_backend_t codes.
const std::vector<Backend>& AllBackends();
// "gloo" or "nccl" (static storage): the name every front end uses.
const char* ToString(Backend backend);
// The backend named `name` (exactly as ToString writes it). Throws
// InvalidArgumentError naming the known names otherwise.
Backend ParseBackend(const std::string& name);
// Throws InvalidArgumentError when this build cannot run `backend` (NCCL
// in a build without CUDA): the one place that says so.
void RequireBuilt(Backend backend);

}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_BACKEND_H_
