// fsdp2/core/strategy/memory_stats.cc
//
// The optimizer's state bytes and the process's resident memory behind
// StrategyMemoryStats.
#include "core/strategy/memory_stats.h"

#include <ATen/DeviceAccelerator.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

#include "core/common/error.h"

namespace fsdp2 {
namespace strategy {
namespace {

int64_t Bytes(std::initializer_list<at::Tensor> tensors) {
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (t.defined()) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

// The tensors a state of an unknown type writes when serialized.
int64_t SerializedTensorBytes(const torch::optim::OptimizerParamState& state) {
  torch::serialize::OutputArchive out;
  state.serialize(out);
  std::ostringstream buffer;
  out.save_to(buffer);
  torch::serialize::InputArchive in;
  std::istringstream read(buffer.str());
  in.load_from(read);
  int64_t bytes = 0;
  for (const std::string& key : in.keys()) {
    at::Tensor t;
    if (in.try_read(key, t, /*is_buffer=*/true) && t.defined()) {
      bytes += static_cast<int64_t>(t.nbytes());
    }
  }
  return bytes;
}

int64_t StateBytes(const torch::optim::OptimizerParamState& state) {
  using namespace torch::optim;  // NOLINT: the state types below
  if (auto* s = dynamic_cast<const AdamWParamState*>(&state)) {
    return Bytes({s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()});
  }
  if (auto* s = dynamic_cast<const AdamParamState*>(&state)) {
    return Bytes({s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()});
  }
  if (auto* s = dynamic_cast<const SGDParamState*>(&state)) {
    return Bytes({s->momentum_buffer()});
  }
  if (auto* s = dynamic_cast<const AdagradParamState*>(&state)) {
    return Bytes({s->sum()});
  }
  if (auto* s = dynamic_cast<const RMSpropParamState*>(&state)) {
    return Bytes({s->square_avg(), s->momentum_buffer(), s->grad_avg()});
  }
  return SerializedTensorBytes(state);
}

// The number of a "<field>:   <n> kB" line of /proc/self/status, in bytes.
int64_t KiBToBytes(const std::string& line, const char* field) {
  return std::atoll(line.c_str() + std::char_traits<char>::length(field)) * 1024;
}

}  // namespace

int64_t OptimizerStateBytes(const torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& item : optimizer.state()) {
    if (item.second) bytes += StateBytes(*item.second);
  }
  return bytes;
}

ResidentMemory ProcessResidentMemory() {
  ResidentMemory memory;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) memory.rss_bytes = KiBToBytes(line, "VmRSS:");
    if (line.rfind("VmHWM:", 0) == 0) memory.peak_rss_bytes = KiBToBytes(line, "VmHWM:");
  }
  return memory;
}

void AddDeviceMemory(const at::Device& device, StrategyMemoryStats& stats) {
  if (device.is_cpu()) return;
  const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const auto s = at::getDeviceAllocator(device.type())->getDeviceStats(device.index());
  stats.device_allocated_bytes = s.allocated_bytes[all].current;
  stats.device_reserved_bytes = s.reserved_bytes[all].current;
  stats.peak_device_allocated_bytes = s.allocated_bytes[all].peak;
  stats.peak_device_reserved_bytes = s.reserved_bytes[all].peak;
}

void ResetPeakDeviceMemory(const at::Device& device) {
  if (device.is_cpu()) return;
  at::getDeviceAllocator(device.type())->resetPeakStats(device.index());
}

void ResetPeakResidentBytes() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  if (!out) {
    throw IoError(
        "cannot reset the peak resident memory: writing \"5\" to /proc/self/clear_refs "
        "failed (needs Linux 4.0 or later and a writable /proc)");
  }
}

}  // namespace strategy
}  // namespace fsdp2
