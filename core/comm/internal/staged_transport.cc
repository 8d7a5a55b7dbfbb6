#include "core/comm/internal/staged_transport.h"

#include <ATen/ATen.h>

namespace fsdp2 {
namespace comm {
namespace internal {

std::unique_ptr<StagedTransport> StagedTransport::ThroughHost(std::unique_ptr<Transport> host) {
  return std::make_unique<StagedTransport>(std::move(host), at::Device(at::kCPU));
}

std::unique_ptr<StagedTransport> StagedTransport::ThroughDevice(
    std::unique_ptr<Transport> device_transport, const at::Device& device) {
  return std::make_unique<StagedTransport>(std::move(device_transport), device);
}

StagedTransport::StagedTransport(std::unique_ptr<Transport> inner, const at::Device& carried)
    : Transport(inner->rank(), inner->world()), inner_(std::move(inner)), carried_(carried) {}

bool StagedTransport::Carried(const at::Tensor& t) const {
  return t.is_cpu() == carried_.is_cpu();
}

at::Tensor StagedTransport::Stage(const at::Tensor& t) const {
  return Carried(t) ? t : t.to(carried_, /*non_blocking=*/false, /*copy=*/true);
}

at::Tensor StagedTransport::StageOutput(const at::Tensor& output) const {
  return Carried(output) ? output : at::empty(output.sizes(), output.options().device(carried_));
}

void StagedTransport::Unstage(const at::Tensor& original, const at::Tensor& staged) const {
  // To pageable host memory this copy waits for the device.
  if (!Carried(original)) original.copy_(staged);
}

void StagedTransport::InPlace(const at::Tensor& tensor, const InPlaceCollective& collective) {
  const at::Tensor staged = Stage(tensor);
  collective(staged);
  Unstage(tensor, staged);
}

void StagedTransport::OutOfPlace(const at::Tensor& output, const at::Tensor& input,
                                 const OutOfPlaceCollective& collective) {
  const at::Tensor out = StageOutput(output);
  collective(out, Stage(input));
  Unstage(output, out);
}

void StagedTransport::all_gather_into_flat(const at::Tensor& output,
                                           const at::Tensor& input) {
  OutOfPlace(output, input, [&](const at::Tensor& out, const at::Tensor& in) {
    inner_->all_gather_into_flat(out, in);
  });
}

void StagedTransport::all_gather_pieces(const at::Tensor& buffer,
                                        const std::vector<Piece>& pieces) {
  InPlace(buffer, [&](const at::Tensor& b) { inner_->all_gather_pieces(b, pieces); });
}

// A staged `input` is a copy: the original is not used as scratch.
void StagedTransport::reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                                          ReduceScatterAlgorithm algorithm) {
  OutOfPlace(output, input, [&](const at::Tensor& out, const at::Tensor& in) {
    inner_->reduce_scatter_flat(out, in, algorithm);
  });
}

void StagedTransport::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  InPlace(tensor, [&](const at::Tensor& t) { inner_->all_reduce(t, op); });
}

void StagedTransport::broadcast(const at::Tensor& tensor, int root) {
  InPlace(tensor, [&](const at::Tensor& t) { inner_->broadcast(t, root); });
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
