// fsdp2/core/comm/internal/c10d.h
//
// The c10d headers core/comm builds on: the stores (TCP, file, in-process
// hash, prefix) and,
// in CUDA builds, ProcessGroupNCCL. Every process group is a c10d::Backend.
// ProcessGroupGloo.hpp is not here: gloo_backend.h says why.
#ifndef FSDP2_CORE_COMM_INTERNAL_C10D_H_
#define FSDP2_CORE_COMM_INTERNAL_C10D_H_

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#endif  // FSDP2_CORE_COMM_INTERNAL_C10D_H_
