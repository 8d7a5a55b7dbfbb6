// fsdp2/core/strategy/trainer.h
//
// Trainer: a small training loop over FSDP2Strategy (Lightning's Trainer
// role). fit() runs epochs of optimizer steps (each step accumulating
// `accumulate_grad_batches` loader batches, communicating gradients only on
// the last), clips gradients to a global norm, validates every k steps, and
// reports: a progress bar on a terminal or plain lines otherwise (rank 0),
// metrics as JSON lines and CSV, and a loss curve as SVG at the end.
//
// Every method is collective: all ranks call it with loaders from the same
// strategy.
#ifndef FSDP2_CORE_STRATEGY_TRAINER_H_
#define FSDP2_CORE_STRATEGY_TRAINER_H_

#include <functional>
#include <string>
#include <vector>

#include "core/strategy/fsdp2_strategy.h"

namespace fsdp2 {
namespace strategy {

// What Trainer::fit runs and reports; each field's default below.
struct TrainerOptions {
  int64_t max_epochs = 1;  // epochs to train when max_steps is -1; default 1
  int64_t max_steps = -1;  // optimizer steps; -1: as many as max_epochs give
  int accumulate_grad_batches = 1;  // loader batches per optimizer step, >= 1
  double gradient_clip_val = 0;  // global max norm; 0: no clipping
  int64_t val_check_interval = 0;  // validate every k steps; 0: epoch ends
  int64_t limit_val_batches = -1;  // -1: all
  int64_t log_every_n_steps = 1;  // plain-line report period (below 1: 1)
  // Tokens per sample row, for tokens/s (0: report samples/s).
  int64_t tokens_per_row = 0;
  std::string metrics_jsonl;  // rank 0 writes these when set
  std::string metrics_csv;  // the same per step as CSV; "": none
  std::string loss_curve_svg;  // the loss curve, written by rank 0 at the end
  // Progress bar: -1 when stdout is a terminal, 1 always, 0 never.
  int progress_bar = -1;
  // Called on every rank after every `checkpoint_every_n_steps` optimizer
  // steps and at the end of fit (0: never), with the step count.
  int64_t checkpoint_every_n_steps = 0;
  // What a checkpoint does, given the strategy and the step count; empty
  // (default): save_checkpoint(checkpoint_dir) if that is set.
  std::function<void(FSDP2Strategy&, int64_t step)> on_checkpoint;
  // Called on every rank after every optimizer step (after its checkpoint,
  // if any), with the step count.
  std::function<void(FSDP2Strategy&, int64_t step)> on_step_end;
  // Where checkpoints go: fit() checks it (check_checkpoint_target) before
  // the first step, and saves there when on_checkpoint is not set.
  std::string checkpoint_dir;
};

// One optimizer step as fit() reports it; the same on every rank.
struct StepMetrics {
  int64_t step = 0;  // 1-based optimizer step
  int64_t epoch = 0;  // the epoch the step belongs to (0-based)
  double loss = 0;   // mean over micro-batches and data-parallel ranks
  double grad_norm = 0;  // global norm before clipping (0 without clipping)
  double throughput = 0;  // tokens (or samples) per second
  double step_ms = 0;  // wall time of the step, in milliseconds
  double val_loss = -1;   // -1: not validated at this step
  std::vector<int64_t> peak_rss_bytes;  // per rank
};

// A training loop over a set-up, parallelized strategy (see the file
// comment). Keeps a reference to the strategy, which must outlive it.
class Trainer {
 public:
  // Throws InvalidArgumentError when accumulate_grad_batches < 1, or when
  // neither max_epochs >= 1 nor max_steps >= 0.
  Trainer(FSDP2Strategy& strategy, TrainerOptions options);

  // Trains until max_steps or max_epochs; validates on `val` if given.
  // Returns the metrics of every step (on every rank).
  const std::vector<StepMetrics>& fit(DataLoader& train, DataLoader* val = nullptr);
  // Mean loss over the loader's batches (limit_val_batches applies).
  double validate(DataLoader& val);
  // The same through the module's test step: the mean test loss.
  double test(DataLoader& data);
  // This rank's predictions, one tensor per batch.
  std::vector<at::Tensor> predict(DataLoader& data);

  // Every step fit() has taken so far, in order (fit's return value).
  const std::vector<StepMetrics>& history() const { return history_; }

 private:
  double evaluate(DataLoader& data, bool test);
  void report(const StepMetrics& m, int64_t total_steps, double elapsed_s);
  void write_outputs_header();
  void write_metrics(const StepMetrics& m);
  void write_loss_curve() const;

  FSDP2Strategy& strategy_;
  TrainerOptions options_;
  std::vector<StepMetrics> history_;
  bool show_bar_ = false;
};

// An SVG line chart of training (and validation) loss against step.
std::string LossCurveSvg(const std::vector<StepMetrics>& history);

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_TRAINER_H_
