#include "core/comm/internal/host_staged_transport.h"

#include <ATen/ATen.h>

namespace fsdp2 {
namespace comm {
namespace internal {
namespace {

// `t` itself on the CPU, else a host copy of it.
at::Tensor OnHost(const at::Tensor& t) {
  return t.is_cpu() ? t : t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

// Writes a host result back into its device tensor (nothing for a CPU one).
void Back(const at::Tensor& device, const at::Tensor& host) {
  if (!device.is_cpu()) device.copy_(host);
}

}  // namespace

HostStagedTransport::HostStagedTransport(std::unique_ptr<Transport> host)
    : Transport(host->rank(), host->world()), host_(std::move(host)) {}

void HostStagedTransport::all_gather_into_flat(const at::Tensor& output,
                                               const at::Tensor& input) {
  if (output.is_cpu() && input.is_cpu()) return host_->all_gather_into_flat(output, input);
  at::Tensor out = output.is_cpu() ? output : at::empty(output.sizes(), output.options().device(at::kCPU));
  host_->all_gather_into_flat(out, OnHost(input));
  Back(output, out);
}

void HostStagedTransport::all_gather_pieces(const at::Tensor& buffer,
                                            const std::vector<Piece>& pieces) {
  if (buffer.is_cpu()) return host_->all_gather_pieces(buffer, pieces);
  at::Tensor host = OnHost(buffer);
  host_->all_gather_pieces(host, pieces);
  Back(buffer, host);
}

void HostStagedTransport::reduce_scatter_flat(const at::Tensor& output,
                                              const at::Tensor& input,
                                              ReduceScatterAlgorithm algorithm) {
  if (output.is_cpu() && input.is_cpu()) {
    return host_->reduce_scatter_flat(output, input, algorithm);
  }
  at::Tensor out = output.is_cpu() ? output : at::empty(output.sizes(), output.options().device(at::kCPU));
  host_->reduce_scatter_flat(out, OnHost(input), algorithm);
  Back(output, out);
}

void HostStagedTransport::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  if (tensor.is_cpu()) return host_->all_reduce(tensor, op);
  at::Tensor host = OnHost(tensor);
  host_->all_reduce(host, op);
  Back(tensor, host);
}

void HostStagedTransport::broadcast(const at::Tensor& tensor, int root) {
  if (tensor.is_cpu()) return host_->broadcast(tensor, root);
  at::Tensor host = OnHost(tensor);
  host_->broadcast(host, root);
  Back(tensor, host);
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
