// fsdp2/core/strategy/token_dataset.h
//
// A language-model dataset read from a flat file of token ids (uint8,
// uint16 or int32, native byte order, no header), memory-mapped: the file
// is cut into non-overlapping windows of block_size + 1 tokens, and a batch
// is {inputs [B, block_size], targets [B, block_size]} (targets shifted by
// one), as int64. Only the rows a batch needs are read from the mapping.
//
//   TokenDatasetOptions o;  o.block_size = 256;  o.end_fraction = 0.9;
//   TokenLoader train = MakeTokenLoader(strategy, "tokens.bin", o, /*global_batch_size=*/32);
//   strategy::TrainingStepOnRows(strategy, train.batch(i), i, 1);
#ifndef FSDP2_CORE_STRATEGY_TOKEN_DATASET_H_
#define FSDP2_CORE_STRATEGY_TOKEN_DATASET_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "core/strategy/fsdp2_strategy.h"

namespace fsdp2 {
namespace strategy {

// The file's token type: uint8 (a text file's bytes), uint16 or int32,
// native byte order.
enum class TokenType { kUInt8, kUInt16, kInt32 };

// Bytes per token of `type`.
int64_t TokenSize(TokenType type);

// How a token file is read and cut into windows.
struct TokenDatasetOptions {
  TokenType token_type = TokenType::kUInt8;  // default uint8
  int64_t block_size = 64;  // tokens per input row
  // The share of the file's windows to use, [begin, end): e.g. [0, 0.9)
  // for training and [0.9, 1) for validation.
  double begin_fraction = 0;  // default 0: from the first window
  double end_fraction = 1;  // exclusive; default 1: to the last window
};

// The windows [rows, block_size + 1] of the file's chosen fraction, over a
// private read-only mapping that lives as long as any tensor viewing it.
// For uint16 files the tensor's dtype is int16 (LibTorch has no uint16):
// read it through TokenLoader, which widens the bits. Throws IoError when
// the file cannot be opened or mapped or its size is not a multiple of the
// token size, NotFoundError when it does not exist, InvalidArgumentError for
// bad options.
at::Tensor MapTokenWindows(const std::string& path, const TokenDatasetOptions& options);

// This data-parallel rank's batches of a token file's windows.
class TokenLoader {
 public:
  // A loader over `windows` (a DataLoader of [rows, block_size + 1] token
  // windows, as MakeTokenLoader builds it) of `token_type` tokens.
  TokenLoader(DataLoader windows, TokenType token_type, int64_t block_size);
  // Global batches per epoch (the sampler's drop_last decides a partial one).
  int64_t num_batches() const { return windows_.num_batches(); }
  // {inputs, targets}, int64 [local rows, block_size]. Throws
  // InvalidArgumentError for an index outside 0..num_batches()-1.
  Batch batch(int64_t index) const;
  // Reshuffles the windows for `epoch` (the order depends only on the seed
  // and epoch, the same on every rank).
  void set_epoch(int64_t epoch) { windows_.set_epoch(epoch); }
  // Tokens per input row (each window holds one more).
  int64_t block_size() const { return block_size_; }

 private:
  DataLoader windows_;
  TokenType token_type_;
  int64_t block_size_;
};

// MapTokenWindows, cut by strategy.process_dataloader into global batches
// of `global_batch_size` windows. Throws InvalidArgumentError when the
// chosen fraction holds fewer windows than one global batch, and
// FailedPreconditionError before strategy.setup_environment().
TokenLoader MakeTokenLoader(const FSDP2Strategy& strategy, const std::string& path,
                            const TokenDatasetOptions& options, int64_t global_batch_size);

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_TOKEN_DATASET_H_
