// fsdp2/core/strategy/token_dataset.h
//
// A language-model dataset read from a flat file of token ids (uint8,
// uint16 or int32, native byte order, no header), memory-mapped: the file
// is cut into non-overlapping windows of block_size + 1 tokens, and a batch
// is {inputs [B, block_size], targets [B, block_size]} (targets shifted by
// one), as int64. Only the rows a batch needs are read from the mapping.
//
// A directory written by fsdp2.prepare_data (docs/data-format.md: meta.json
// with tokens.bin, labels.bin and segments.bin, int32 [rows, seq_len]) loads
// through the same loader: a batch is then {inputs, targets, segments}, the
// targets already shifted and -100 where nothing is learned (prompts, chat
// templates, padding, documents' last tokens), the segments numbering the
// documents packed into each row (-1 for padding).
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

// A dataset of fsdp2.prepare_data (see the file comment), mapped: its rows
// in [begin_fraction, end_fraction) of tokens, labels and segments, int32
// [rows, seq_len] over read-only mappings.
struct PreparedDataset {
  at::Tensor tokens;    // input token ids
  at::Tensor labels;    // shifted targets, -100 where nothing is learned
  at::Tensor segments;  // each token's document in its row, -1 for padding
  int64_t seq_len = 0;  // tokens per row
};

// Whether `path` is a directory holding a prepared dataset's meta.json.
bool IsPreparedDataset(const std::string& path);

// Maps the prepared dataset in directory `dir`. Throws IoError naming the
// file for a meta.json that is not one of format "fsdp2-sft" version 1, a
// data file whose size is not rows x seq_len int32 values, or one that
// cannot be mapped; InvalidArgumentError for bad fractions.
PreparedDataset MapPreparedDataset(const std::string& dir, double begin_fraction = 0,
                                   double end_fraction = 1);

// This data-parallel rank's batches of a token file's windows, or of a
// prepared dataset's rows.
class TokenLoader {
 public:
  // A loader over `windows` (a DataLoader of [rows, block_size + 1] token
  // windows, as MakeTokenLoader builds it) of `token_type` tokens.
  TokenLoader(DataLoader windows, TokenType token_type, int64_t block_size);
  // A loader over a prepared dataset's rows (a DataLoader of {tokens,
  // labels, segments}, as MakeTokenLoader builds it).
  static TokenLoader Prepared(DataLoader rows, int64_t seq_len);
  // Global batches per epoch (the sampler's drop_last decides a partial one).
  int64_t num_batches() const { return windows_.num_batches(); }
  // {inputs, targets}, int64 [local rows, block_size], or for a prepared
  // dataset {inputs, targets, segments}. Throws InvalidArgumentError for an
  // index outside 0..num_batches()-1.
  Batch batch(int64_t index) const;
  // Reshuffles the windows for `epoch` (the order depends only on the seed
  // and epoch, the same on every rank).
  void set_epoch(int64_t epoch) { windows_.set_epoch(epoch); }
  // Tokens per input row (each window holds one more; a prepared
  // dataset's seq_len).
  int64_t block_size() const { return block_size_; }
  // Whether the rows come from a prepared dataset.
  bool prepared() const { return prepared_; }

 private:
  DataLoader windows_;
  TokenType token_type_;
  int64_t block_size_;
  bool prepared_ = false;
};

// MapTokenWindows, cut by strategy.process_dataloader into global batches
// of `global_batch_size` windows; for a prepared dataset's directory
// (IsPreparedDataset) MapPreparedDataset's rows instead, whose seq_len
// replaces options.block_size (token_type is not used). Throws
// InvalidArgumentError when the chosen fraction holds fewer windows than
// one global batch, and FailedPreconditionError before
// strategy.setup_environment().
TokenLoader MakeTokenLoader(const FSDP2Strategy& strategy, const std::string& path,
                            const TokenDatasetOptions& options, int64_t global_batch_size);

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_TOKEN_DATASET_H_
