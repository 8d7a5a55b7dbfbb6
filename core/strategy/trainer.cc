#include "core/strategy/trainer.h"
#include "core/common/error.h"
#include "core/strategy/micro_batch_step.h"

#include <ATen/ATen.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace fsdp2 {
namespace strategy {
namespace {

int64_t PeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", (long long)(s / 3600),
                (long long)(s / 60 % 60), (long long)(s % 60));
  return buf;
}

}  // namespace

Trainer::Trainer(FSDP2Strategy& strategy, TrainerOptions options)
    : strategy_(strategy), options_(std::move(options)) {
  if (options_.accumulate_grad_batches < 1) {
    throw InvalidArgumentError("Trainer: accumulate_grad_batches must be at least 1");
  }
  if (options_.max_epochs < 1 && options_.max_steps < 0) {
    throw InvalidArgumentError("Trainer: set max_epochs >= 1 or max_steps >= 0");
  }
  if (options_.log_every_n_steps < 1) options_.log_every_n_steps = 1;
  show_bar_ = options_.progress_bar == 1 ||
              (options_.progress_bar == -1 && isatty(STDOUT_FILENO));
}

const std::vector<StepMetrics>& Trainer::fit(DataLoader& train, DataLoader* val) {
  const int accum = options_.accumulate_grad_batches;
  const int64_t steps_per_epoch = train.num_batches() / accum;
  if (steps_per_epoch < 1) {
    throw InvalidArgumentError(
        "Trainer::fit: an epoch has " + std::to_string(train.num_batches()) +
        " batches, fewer than accumulate_grad_batches (" + std::to_string(accum) + ")");
  }
  const int64_t total = options_.max_steps >= 0
                            ? options_.max_steps
                            : steps_per_epoch * options_.max_epochs;
  const bool rank0 = strategy_.world()->rank() == 0;
  const int n = strategy_.world()->size();
  // A target that cannot take a checkpoint fails now, not after training.
  if (!options_.checkpoint_dir.empty()) strategy_.check_checkpoint_target(options_.checkpoint_dir);
  if (rank0) write_outputs_header();
  const int64_t rows_per_batch = train.sampler().local_batch_size() * strategy_.data_parallel_size();
  const auto start = std::chrono::steady_clock::now();
  int64_t step = strategy_.current_epoch_step().step;
  for (int64_t epoch = strategy_.current_epoch_step().epoch; step < total; ++epoch) {
    strategy_.set_epoch(epoch);
    train.set_epoch(epoch);
    // Resume mid-epoch: skip the batches of steps already taken.
    int64_t first = (step - epoch * steps_per_epoch) * accum;
    if (first < 0 || first >= steps_per_epoch * accum) first = 0;
    for (int64_t b = first; b + accum <= steps_per_epoch * accum && step < total; b += accum) {
      const auto t0 = std::chrono::steady_clock::now();
      const MicroBatchStepResult r = MicroBatchStep(
          strategy_, accum, [&](int micro) { return MicroBatch{train.batch(b + micro), b + micro}; },
          options_.gradient_clip_val);
      StepMetrics m;
      m.grad_norm = r.grad_norm;
      m.step = ++step;
      m.epoch = epoch;
      // One all-reduce carries the loss and every rank's peak memory.
      at::Tensor shared = at::zeros({1 + n}, at::kDouble);
      shared[0] = r.local_loss;
      shared[1 + strategy_.world()->rank()] = static_cast<double>(PeakRssBytes());
      strategy_.world()->group()->all_reduce(shared).wait();
      m.loss = shared[0].item<double>() / n;
      for (int r = 0; r < n; ++r) {
        m.peak_rss_bytes.push_back(static_cast<int64_t>(shared[1 + r].item<double>()));
      }
      m.step_ms = std::chrono::duration<double, std::milli>(
                      std::chrono::steady_clock::now() - t0).count();
      const double units = double(rows_per_batch) * accum *
                           (options_.tokens_per_row > 0 ? options_.tokens_per_row : 1);
      m.throughput = units / (m.step_ms / 1e3);
      const bool epoch_end = b + 2 * accum > steps_per_epoch * accum;
      if (val != nullptr &&
          ((options_.val_check_interval > 0 && step % options_.val_check_interval == 0) ||
           (options_.val_check_interval == 0 && epoch_end) || step == total)) {
        m.val_loss = validate(*val);
      }
      history_.push_back(m);
      if (rank0) {
        write_metrics(m);
        report(m, total, std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - start).count());
      }
      if (options_.checkpoint_every_n_steps > 0 &&
          (step % options_.checkpoint_every_n_steps == 0 || step == total)) {
        if (options_.on_checkpoint) {
          options_.on_checkpoint(strategy_, step);
        } else if (!options_.checkpoint_dir.empty()) {
          strategy_.save_checkpoint(options_.checkpoint_dir);
        }
      }
      if (options_.on_step_end) options_.on_step_end(strategy_, step);
    }
  }
  if (rank0) {
    if (show_bar_) std::printf("\n");
    write_loss_curve();
    std::fflush(stdout);
  }
  return history_;
}

double Trainer::evaluate(DataLoader& data, bool test) {
  int64_t batches = data.num_batches();
  if (options_.limit_val_batches >= 0) batches = std::min(batches, options_.limit_val_batches);
  if (batches < 1) throw InvalidArgumentError("Trainer: no batches to evaluate");
  double sum = 0;
  for (int64_t b = 0; b < batches; ++b) {
    at::Tensor loss = test ? strategy_.test_step(data.batch(b), b)
                           : strategy_.validation_step(data.batch(b), b);
    sum += loss.item<double>();
  }
  return sum / batches;
}

double Trainer::validate(DataLoader& val) { return evaluate(val, /*test=*/false); }
double Trainer::test(DataLoader& data) { return evaluate(data, /*test=*/true); }

std::vector<at::Tensor> Trainer::predict(DataLoader& data) {
  std::vector<at::Tensor> out;
  for (int64_t b = 0; b < data.num_batches(); ++b) {
    out.push_back(strategy_.predict_step(data.batch(b), b));
  }
  return out;
}

void Trainer::report(const StepMetrics& m, int64_t total, double elapsed_s) {
  const bool last = m.step == total;
  if (!show_bar_ && m.step % options_.log_every_n_steps != 0 && !last) return;
  const char* unit = options_.tokens_per_row > 0 ? "tok/s" : "samples/s";
  int64_t peak = 0;
  for (int64_t b : m.peak_rss_bytes) peak = std::max(peak, b);
  const double done = double(m.step) / std::max<int64_t>(total, 1);
  const double eta = done > 0 ? elapsed_s * (1 - done) / done : 0;
  char val[48] = "";
  if (m.val_loss >= 0) std::snprintf(val, sizeof(val), "  val_loss %.4f", m.val_loss);
  if (show_bar_) {
    const int width = 24, filled = static_cast<int>(done * width);
    std::string bar(filled, '=');
    if (filled < width) bar += '>' + std::string(width - filled - 1, ' ');
    std::printf("\r[%s] %lld/%lld  loss %.4f%s  %.0f %s  ETA %s ", bar.c_str(),
                (long long)m.step, (long long)total, m.loss, val, m.throughput, unit,
                Duration(eta).c_str());
    if (m.val_loss >= 0) std::printf("\n");
  } else {
    std::printf("step %lld/%lld  epoch %lld  loss %.4f%s  grad_norm %.3f  %.0f %s  "
                "%.0f ms  peak_rss %.0f MiB  ETA %s\n",
                (long long)m.step, (long long)total, (long long)m.epoch, m.loss, val,
                m.grad_norm, m.throughput, unit, m.step_ms, peak / 1048576.0,
                Duration(eta).c_str());
  }
  std::fflush(stdout);
}

void Trainer::write_outputs_header() {
  for (const auto* path : {&options_.metrics_jsonl, &options_.metrics_csv}) {
    if (path->empty()) continue;
    std::ofstream f(*path, std::ios::trunc);
    if (!f) throw IoError("Trainer: cannot write " + *path);
    if (path == &options_.metrics_csv) {
      f << "step,epoch,loss,grad_norm,throughput,step_ms,val_loss,peak_rss_bytes_max\n";
    }
  }
}

void Trainer::write_metrics(const StepMetrics& m) {
  int64_t peak = 0;
  for (int64_t b : m.peak_rss_bytes) peak = std::max(peak, b);
  if (!options_.metrics_jsonl.empty()) {
    std::ofstream f(options_.metrics_jsonl, std::ios::app);
    f << std::setprecision(10) << "{\"step\": " << m.step << ", \"epoch\": " << m.epoch
      << ", \"loss\": " << m.loss << ", \"grad_norm\": " << m.grad_norm << ", \""
      << (options_.tokens_per_row > 0 ? "tokens_per_s" : "samples_per_s")
      << "\": " << m.throughput << ", \"step_ms\": " << m.step_ms;
    if (m.val_loss >= 0) f << ", \"val_loss\": " << m.val_loss;
    f << ", \"peak_rss_bytes\": [";
    for (size_t r = 0; r < m.peak_rss_bytes.size(); ++r) {
      f << (r ? ", " : "") << m.peak_rss_bytes[r];
    }
    f << "]}\n";
  }
  if (!options_.metrics_csv.empty()) {
    std::ofstream f(options_.metrics_csv, std::ios::app);
    f << std::setprecision(10) << m.step << "," << m.epoch << "," << m.loss << ","
      << m.grad_norm << "," << m.throughput << "," << m.step_ms << ",";
    if (m.val_loss >= 0) f << m.val_loss;
    f << "," << peak << "\n";
  }
}

void Trainer::write_loss_curve() const {
  if (options_.loss_curve_svg.empty()) return;
  std::ofstream f(options_.loss_curve_svg);
  if (!f) throw IoError("Trainer: cannot write " + options_.loss_curve_svg);
  f << LossCurveSvg(history_);
}

std::string LossCurveSvg(const std::vector<StepMetrics>& history) {
  const double W = 640, H = 400, left = 60, right = 20, top = 30, bottom = 50;
  double lo = INFINITY, hi = -INFINITY;
  int64_t max_step = 1;
  for (const auto& m : history) {
    lo = std::min(lo, m.loss);
    hi = std::max(hi, m.loss);
    if (m.val_loss >= 0) {
      lo = std::min(lo, m.val_loss);
      hi = std::max(hi, m.val_loss);
    }
    max_step = std::max(max_step, m.step);
  }
  if (history.empty()) lo = 0, hi = 1;
  if (hi - lo < 1e-9) hi = lo + 1;
  auto x = [&](double step) { return left + (W - left - right) * step / max_step; };
  auto y = [&](double loss) { return top + (H - top - bottom) * (hi - loss) / (hi - lo); };
  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"18\" text-anchor=\"middle\">loss</text>\n"
    << "<line x1=\"" << left << "\" y1=\"" << H - bottom << "\" x2=\"" << W - right
    << "\" y2=\"" << H - bottom << "\" stroke=\"black\"/>\n"
    << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\""
    << H - bottom << "\" stroke=\"black\"/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double v = lo + (hi - lo) * i / 4;
    s << "<text x=\"" << left - 6 << "\" y=\"" << y(v) + 4 << "\" text-anchor=\"end\">"
      << std::setprecision(3) << v << std::setprecision(1) << "</text>\n";
    const double st = max_step * i / 4.0;
    s << "<text x=\"" << x(st) << "\" y=\"" << H - bottom + 16
      << "\" text-anchor=\"middle\">" << static_cast<int64_t>(st) << "</text>\n";
  }
  s << "<text x=\"" << W / 2 << "\" y=\"" << H - 10 << "\" text-anchor=\"middle\">step</text>\n";
  s << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
  for (const auto& m : history) s << x(m.step) << "," << y(m.loss) << " ";
  s << "\"/>\n";
  std::ostringstream val;
  for (const auto& m : history) {
    if (m.val_loss >= 0) val << x(m.step) << "," << y(m.val_loss) << " ";
  }
  if (!val.str().empty()) {
    s << "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"1.5\" points=\""
      << val.str() << "\"/>\n"
      << "<text x=\"" << W - right - 4 << "\" y=\"" << top + 30
      << "\" text-anchor=\"end\" fill=\"#d62728\">validation</text>\n";
  }
  s << "<text x=\"" << W - right - 4 << "\" y=\"" << top + 14
    << "\" text-anchor=\"end\" fill=\"#1f77b4\">training</text>\n</svg>\n";
  return s.str();
}

}  // namespace strategy
}  // namespace fsdp2
