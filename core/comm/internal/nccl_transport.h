// fsdp2/core/comm/internal/nccl_transport.h
//
// NcclTransport: a lane's collectives over c10d's NCCL backend, on CUDA
// tensors. It uses NCCL's native flat collectives (_allgather_base,
// _reduce_scatter_base); the piecewise all-gather stages through a flat
// buffer. Reduce-scatters that name an algorithm (kRing, kAllReduce) run
// that algorithm, as on Gloo.
//
// NCCL carries device tensors only: ConnectTransport wraps each lane in a
// StagedTransport (staged_transport.h), through which a CPU tensor (the
// flags and counts that checkpoints and loads exchange) travels as a copy
// on this rank's GPU, the one current when the group was created
// (device()). The transport itself never stages: built directly on a
// Shared over another c10d backend, it carries CPU tensors as they are
// (//tests:nccl_transport_test drives its own logic that way over Gloo,
// where there is no GPU).
//
// One communicator per process group, as c10d has: the lanes of a group
// share one ProcessGroupNCCL and issue to it in the order their collectives
// were issued (issue_order.h: each lane takes its turns as IssueTurns). A
// collective holds its turn while it enqueues its operations and lets the
// next one go before it waits for completion, so an all-gather is enqueued
// while a reduce-scatter runs.
//
// Exists only in builds with USE_C10D_NCCL (a CUDA LibTorch, as PyPI's
// torch 2.11.0 is): compiled and linked in every build, run by
// //tests:nccl_transport_test where a GPU is (and over Gloo everywhere).
// Internal to core/comm; see transport.h for the contract.
#ifndef FSDP2_CORE_COMM_INTERNAL_NCCL_TRANSPORT_H_
#define FSDP2_CORE_COMM_INTERNAL_NCCL_TRANSPORT_H_

#ifdef USE_C10D_NCCL

#include <chrono>
#include <memory>
#include <vector>

#include "core/comm/internal/c10d.h"
#include "core/comm/internal/issue_order.h"
#include "core/comm/internal/transport.h"

namespace fsdp2 {
namespace comm {
namespace internal {

class NcclTransport final : public Transport, public IssueTurns {
 public:
  const char* kind() const override { return "nccl"; }
  // Collective over the `world` ranks sharing `store` (prefixed for this
  // group): creates their NCCL communicator and `lanes` transports that
  // share it and its issue order. Every later operation fails after
  // `timeout`.
  static std::vector<std::unique_ptr<NcclTransport>> ConnectLanes(
      const c10::intrusive_ptr<::c10d::Store>& store, int rank, int world,
      std::chrono::milliseconds timeout, int lanes);

  // The backend, order and GPU its lanes share.
  struct Shared {
    c10::intrusive_ptr<::c10d::Backend> nccl;
    IssueOrder order;
    at::Device device;  // where CPU tensors are staged
    Shared(c10::intrusive_ptr<::c10d::Backend> backend, std::chrono::milliseconds timeout,
           at::Device gpu)
        : nccl(std::move(backend)), order(timeout), device(gpu) {}
  };
  NcclTransport(std::shared_ptr<Shared> shared, int rank, int world,
                std::chrono::milliseconds timeout);

  IssueTurns* issue_turns() override { return this; }
  // The GPU its collectives run on, where CPU tensors are staged.
  const at::Device& device() const { return shared_->device; }

  void all_gather_into_flat(const at::Tensor& output,
                            const at::Tensor& input) override;
  void all_gather_pieces(const at::Tensor& buffer,
                         const std::vector<Piece>& pieces) override;
  // kAuto: NCCL's reduce-scatter; kRing: the send/recv ring; kAllReduce:
  // an all-reduce.
  void reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                           ReduceScatterAlgorithm algorithm) override;
  void all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  void broadcast(const at::Tensor& tensor, int root) override;
  void barrier() override;

 private:
  // Takes this collective's turn, enqueues it (`issue` returns its Work),
  // lets the next collective issue, then waits for this one.
  template <typename Issue>
  void IssueInTurn(Issue issue);

  std::shared_ptr<Shared> shared_;
  ::c10d::Backend& nccl_;  // shared_->nccl
  std::chrono::milliseconds timeout_;
  at::Tensor ring_scratch_;  // receive buffer of the ring reduce-scatter
};

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // USE_C10D_NCCL
#endif  // FSDP2_CORE_COMM_INTERNAL_NCCL_TRANSPORT_H_
