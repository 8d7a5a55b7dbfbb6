#include "core/checkpoint/full_checkpoint.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/checkpoint/internal/host_staging.h"
#include "core/checkpoint/internal/optimizer_state.h"
#include "core/checkpoint/internal/param_layout.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/internal/shared_error.h"
#include "core/checkpoint/internal/swap.h"
#include "core/checkpoint/safetensors.h"
#include "core/fsdp/fully_shard.h"

namespace fsdp2 {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;
constexpr const char* kFormat = "fsdp2.full.v1";
constexpr const char* kOptimPrefix = "optim/";

// The safetensors file of a full checkpoint: DIR/checkpoint.safetensors, or
// PATH itself for a single-file checkpoint of an earlier fsdp2.
std::string FullFile(const std::string& path) {
  return DetectCheckpoint(path) == CheckpointLayout::kFullFile
             ? path
             : (fs::path(path) / kFullCheckpointFile).string();
}

// Rank 0's file in a synchronous full save: gathered tensors are written on
// a thread of its own, so that the next gather runs while the disk takes
// this one. At most two tensors wait. An error stops the writing but not
// push(), so rank 0 keeps taking part in the gathers; finish() commits the
// file or throws that error.
class OverlappedWriter {
 public:
  explicit OverlappedWriter(std::unique_ptr<SafetensorsStreamWriter> writer)
      : writer_(std::move(writer)), thread_([this] { run(); }) {}
  ~OverlappedWriter() {
    close();
    if (thread_.joinable()) thread_.join();
  }

  void push(at::Tensor t) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return queue_.size() < 2; });
    queue_.push_back(std::move(t));
    changed_.notify_all();
  }

  void finish() {
    close();
    thread_.join();
    if (error_) std::rethrow_exception(error_);
    writer_->commit();
  }

 private:
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    changed_.notify_all();
  }

  void run() {
    for (;;) {
      at::Tensor t;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return !queue_.empty() || closed_; });
        if (queue_.empty()) return;
        t = std::move(queue_.front());
        queue_.pop_front();
        changed_.notify_all();
      }
      if (error_) continue;  // drop: the file is lost already
      try {
        writer_->write(t);
      } catch (...) {
        error_ = std::current_exception();
      }
    }
  }

  std::unique_ptr<SafetensorsStreamWriter> writer_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<at::Tensor> queue_;
  bool closed_ = false;
  std::exception_ptr error_;  // the writer thread's only
  std::thread thread_;        // last: starts once the rest exists
};

// Saves (stage = false: rank 0 streams each gathered tensor to the file) or
// stages (rank 0 keeps them and the returned PendingWrite writes the file).
PendingWrite SaveOrStage(const std::string& dir, torch::nn::Module& root,
                         torch::optim::Optimizer* optimizer, comm::World& world,
                         const std::map<std::string, std::string>& progress, bool stage) {
  const std::string kind = internal::OptimizerKind(optimizer);
  const auto layouts = internal::ParamLayouts(root, world.rank());
  std::vector<fsdp::ShardInfo> shards;
  for (const auto& l : layouts) shards.push_back(l.shard);
  // Optimizer state is saved for a parameter only if every rank has it, so
  // that every rank takes part in the same gathers.
  std::vector<c10::optional<internal::ParamState>> states(shards.size());
  at::Tensor missing = at::zeros({static_cast<int64_t>(shards.size()) + 1}, at::kDouble);
  for (size_t i = 0; i < shards.size(); ++i) {
    if (optimizer) states[i] = internal::GetState(*optimizer, shards[i].shard);
    missing[i] = states[i].has_value() ? 0.0 : 1.0;
  }
  world.group()->all_reduce(missing, comm::ReduceOp::kMax).wait();

  std::vector<SafetensorsStreamWriter::Spec> specs;
  std::map<std::string, std::string> meta = {{"fsdp2.checkpoint", kFormat},
                                             {"optimizer", kind},
                                             {"progress", nlohmann::json(progress).dump()}};
  if (optimizer != nullptr) meta["optimizer_groups"] = internal::GroupOptionsJson(*optimizer, kind);
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto& s = shards[i];
    const auto& full_shape = layouts[i].full_shape;
    specs.push_back({s.name, s.shard.scalar_type(), full_shape});
    if (missing[i].item<double>() != 0) states[i].reset();
    if (!states[i]) continue;
    meta["step/" + s.name] = std::to_string(states[i]->step);
    for (const auto& [key, t] : states[i]->tensors) {
      specs.push_back({kOptimPrefix + key + "/" + s.name, t.scalar_type(), full_shape});
    }
  }
  std::unique_ptr<OverlappedWriter> writer;
  std::string error, file;
  if (world.rank() == 0) {
    try {
      file = (fs::path(internal::BeginSave(dir)) / kFullCheckpointFile).string();
      if (!stage) {
        writer = std::make_unique<OverlappedWriter>(
            std::make_unique<SafetensorsStreamWriter>(file, specs, meta));
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  internal::ShareRank0Error(error, world, dir + ": rank 0 cannot save a checkpoint there");
  std::vector<at::Tensor> staged;  // rank 0, when staging
  internal::HostStaging staging;   // GPU tensors to pinned host memory
  auto consume = [&](const at::Tensor& full) {
    if (writer) writer->push(full);
    // Gathered: a tensor of its own, which the next step does not change.
    if (stage && world.rank() == 0) staged.push_back(staging.Stage(full, /*live=*/false));
  };
  for (size_t i = 0; i < shards.size(); ++i) {
    consume(internal::GatherFull(layouts[i], shards[i].shard));
    if (!states[i]) continue;
    for (const auto& item : states[i]->tensors) {
      consume(internal::GatherFull(layouts[i], item.second));
    }
  }
  if (!stage) {
    // Every rank learns whether rank 0's file made it.
    std::string write_error;
    if (writer) {
      try {
        writer->finish();
        internal::CommitSave(dir);
      } catch (const std::exception& e) {
        write_error = e.what();
      }
    }
    internal::ShareRank0Error(write_error, world, dir + ": rank 0 could not write the checkpoint");
    return nullptr;
  }
  if (world.rank() != 0) return [] {};
  staging.Done();
  return [dir, file, specs = std::move(specs), meta = std::move(meta),
          staged = std::move(staged), staging] {
    staging.Wait();
    SafetensorsStreamWriter w(file, specs, meta);
    for (const auto& t : staged) w.write(t);
    w.commit();
    internal::CommitSave(dir);
  };
}

}  // namespace

void SaveFullCheckpoint(const std::string& dir, torch::nn::Module& root,
                        torch::optim::Optimizer* optimizer, comm::World& world,
                        const std::map<std::string, std::string>& progress) {
  SaveOrStage(dir, root, optimizer, world, progress, /*stage=*/false);
  world.group()->barrier().wait();
}

PendingWrite StageFullCheckpoint(const std::string& dir, torch::nn::Module& root,
                                 torch::optim::Optimizer* optimizer, comm::World& world,
                                 const std::map<std::string, std::string>& progress) {
  return SaveOrStage(dir, root, optimizer, world, progress, /*stage=*/true);
}

namespace {

// The parameter a tensor of the file belongs to: "optim/<key>/<p>" or "<p>".
std::string ParamOf(const std::string& name) {
  return name.rfind(kOptimPrefix, 0) == 0 ? name.substr(name.find('/', 6) + 1) : name;
}

// Whether a parameter's rows can be read from the file straight into its
// memory (rank 0 has checked the file's shape and dtype against it).
bool DirectRows(const internal::ParamLayout& l, const SafetensorsFile& f) {
  const std::string& name = l.shard.name;
  return internal::RowsReadInPlace(l) && f.contains(name) &&
         f.info(name).dtype == l.shard.shard.scalar_type() && f.info(name).shape == l.full_shape;
}

}  // namespace

std::map<std::string, std::string> LoadFullCheckpoint(const std::string& target,
                                                      torch::nn::Module& root,
                                                      torch::optim::Optimizer* optimizer,
                                                      comm::World& world) {
  if (world.rank() == 0) internal::RecoverInterruptedSwap(target);
  world.group()->barrier().wait();
  const std::string path = FullFile(target);
  // Rank 0 checks the whole file first: format, names, shapes, checksums.
  const auto layouts = internal::ParamLayouts(root, world.rank());
  std::vector<fsdp::ShardInfo> shards;
  std::map<std::string, const internal::ParamLayout*> layout_of;
  for (const auto& l : layouts) {
    shards.push_back(l.shard);
    layout_of[l.shard.name] = &l;
  }
  const std::string kind = internal::OptimizerKind(optimizer);
  std::string error;
  std::map<std::string, at::Tensor> kept;  // rank 0's rows, from its check
  std::unique_ptr<SafetensorsFile> checked;  // on rank 0, the file it checked
  if (world.rank() == 0) {
    try {
      checked = std::make_unique<SafetensorsFile>(path);
      const SafetensorsFile& f = *checked;
      auto format = f.metadata().find("fsdp2.checkpoint");
      if (format == f.metadata().end() || format->second != kFormat) {
        throw IoError(path + ": not an fsdp2 full checkpoint");
      }
      const std::string saved = f.metadata().at("optimizer");
      if (optimizer != nullptr && saved != kind) {
        throw IoError(path + ": holds " + saved + " optimizer state but the optimizer is " + kind);
      }
      for (const auto& s : shards) {
        if (!f.contains(s.name)) throw IoError(path + ": has no parameter '" + s.name + "'");
        if (f.info(s.name).dtype != s.shard.scalar_type()) {
          throw IoError(path + ": parameter '" + s.name + "' is " +
                                   c10::toString(f.info(s.name).dtype) + " but the model's is " +
                                   c10::toString(s.shard.scalar_type()));
        }
        const auto& full_shape = layout_of.at(s.name)->full_shape;
        if (f.info(s.name).shape != full_shape) {
          throw IoError(path + ": parameter '" + s.name + "' has shape " +
                                   c10::str(at::IntArrayRef(f.info(s.name).shape)) +
                                   " but the model's is " + c10::str(at::IntArrayRef(full_shape)));
        }
      }
      for (const auto& [name, info] : f.tensors()) {
        const std::string param = ParamOf(name);
        bool known = false;
        for (const auto& s : shards) known = known || s.name == param;
        if (!known) {
          throw IoError(path + ": holds parameter '" + param +
                                   "', which the model does not have");
        }
      }
      // Every checksum, in one pass. Where rank 0 holds all of a tensor's
      // optimizer state it keeps what it checked, so that it does not read
      // it again; everything else is only checked, through one small
      // buffer, and read again below (from the page cache by then): rank 0's
      // part of a sharded tensor, and parameters, which are read straight
      // into their memory (see DirectRows).
      f.load_each(
          [&](const std::string& name, const at::Tensor& full) {
            const internal::ParamLayout& l = *layout_of.at(ParamOf(name));
            if (full.sizes().vec() != l.full_shape) return;  // the error comes below
            kept[name] = full.view(l.shard.shard.sizes());
          },
          [&](const std::string& name) {
            const internal::ParamLayout& l = *layout_of.at(ParamOf(name));
            return name.rfind(kOptimPrefix, 0) == 0 && !l.tp &&
                   l.shard.local_rows == l.shard.rows &&
                   l.shard.shard.numel() == c10::multiply_integers(l.full_shape);
          });
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  internal::ShareRank0Error(error, world);

  // Rank 0 reads on from the file it checked (below, a file replaced since
  // is an error before anything is written); the others open it now.
  const SafetensorsFile f = checked ? *checked : SafetensorsFile(path);
  // This rank's rows of a tensor (a 0-d parameter is one row of one element).
  auto rows = [&](const std::string& name, const fsdp::ShardInfo& s) {
    auto mine = kept.find(name);
    if (mine != kept.end()) return mine->second;
    const internal::ParamLayout& l = *layout_of.at(s.name);
    if (l.tp) return internal::LocalOfFull(l, f.load(name));  // TP: this rank's block
    at::Tensor local = s.global_shape.empty()
                           ? f.load(name).reshape({1}).narrow(0, s.row_start, s.local_rows)
                           : f.load_rows(name, s.row_start, s.local_rows);
    return local.reshape(s.shard.sizes());
  };
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  std::vector<const fsdp::ShardInfo*> direct;  // read straight into the parameter
  std::vector<std::pair<const fsdp::ShardInfo*, internal::ParamState>> states;
  for (const auto& s : shards) {
    if (DirectRows(*layout_of.at(s.name), f)) {
      direct.push_back(&s);
    } else {
      copies.emplace_back(s.shard, rows(s.name, s));
    }
    auto step = f.metadata().find("step/" + s.name);
    if (optimizer == nullptr || step == f.metadata().end()) continue;
    internal::ParamState st;
    st.step = std::stoll(step->second);
    for (const auto& key : internal::StateKeys()) {
      const std::string name = kOptimPrefix + key + "/" + s.name;
      if (f.contains(name)) st.tensors[key] = rows(name, s);
    }
    states.emplace_back(&s, std::move(st));
  }
  if (optimizer != nullptr) {
    std::vector<std::pair<std::string, at::Tensor>> with_state;
    for (const auto& item : states) with_state.emplace_back(item.first->name, item.first->shard);
    internal::CheckOptimizerHolds(*optimizer, with_state, path);
    auto groups = f.metadata().find("optimizer_groups");
    if (groups != f.metadata().end()) {
      internal::SetGroupOptions(*optimizer, kind, groups->second, path);
    }
  }
  // Fail before writing anything where the file is no longer the one whose
  // header this rank read.
  f.check_unchanged();
  std::string read_error;
  {
    at::NoGradGuard no_grad;
    for (auto& [target, value] : copies) target.copy_(value);
    try {
      for (const fsdp::ShardInfo* s : direct) {
        if (s->local_rows == 0) continue;
        f.load_rows_into(s->name, s->row_start, s->local_rows,
                         s->shard.view({s->local_rows, -1}));
      }
    } catch (const std::exception& e) {
      read_error = e.what();
    }
  }
  // A read that fails here (the disk, or the file rewritten in place since
  // rank 0 checked it) leaves parameters partly loaded: every rank says so.
  const std::string partly = "; the model's parameters are partly loaded: load a checkpoint again";
  internal::ThrowIfAnyRankFailed(read_error.empty() ? "" : read_error + partly, world,
                                 path + ": another rank could not read its rows" + partly);
  for (auto& [s, st] : states) internal::SetState(*optimizer, kind, s->shard, st);
  world.group()->barrier().wait();
  return nlohmann::json::parse(f.metadata().at("progress"))
      .get<std::map<std::string, std::string>>();
}

void RemoveFullCheckpoint(const std::string& target, comm::World& world) {
  world.group()->barrier().wait();
  std::string error;
  if (world.rank() == 0) {
    const std::string path = FullFile(target);
    try {
      SafetensorsFile f(path);
      auto format = f.metadata().find("fsdp2.checkpoint");
      if (format == f.metadata().end() || format->second != kFormat) throw IoError("");
      fs::remove(path);
      std::error_code ec;
      if (path != target) fs::remove(target, ec);  // only if nothing else is left in it
    } catch (const std::exception&) {
      error = target + ": not an fsdp2 checkpoint; refusing to remove it";
    }
  }
  internal::ShareRank0Error(error, world);
}

}  // namespace checkpoint
}  // namespace fsdp2
