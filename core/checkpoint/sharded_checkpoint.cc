#include "core/checkpoint/sharded_checkpoint.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "core/checkpoint/internal/host_staging.h"
#include "core/checkpoint/internal/optimizer_state.h"
#include "core/checkpoint/internal/param_layout.h"
#include "core/checkpoint/internal/shared_error.h"
#include "core/checkpoint/internal/swap.h"
#include "core/checkpoint/safetensors.h"
#include "core/fsdp/fully_shard.h"

namespace fsdp2 {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;
using internal::GetState;
using internal::OptimizerKind;
using internal::ParamState;
using internal::RecoverInterruptedSwap;
using internal::RowNumel;
using internal::SetState;
constexpr const char* kFormat = "fsdp2.sharded.v1";

std::string ShardFile(int rank, int world) {
  return "rank" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors";
}

// A local shard (or optimizer tensor shaped like it) as [rows, row_numel].
at::Tensor AsRows(const at::Tensor& t, const fsdp::ShardInfo& s) {
  return t.detach().reshape({s.local_rows, RowNumel(s.global_shape)});
}

// The collective part of a save; the returned PendingWrite writes the
// files. `snapshot`: copy this rank's rows now, so that training may go on
// while the write runs on another thread; without it the write reads the
// live shards and must run before they change.
PendingWrite Stage(const std::string& dir, torch::nn::Module& root,
                   torch::optim::Optimizer* optimizer, comm::World& world,
                   const std::map<std::string, std::string>& progress,
                   std::chrono::milliseconds wait_for_ranks, bool snapshot) {
  const std::string kind = OptimizerKind(optimizer);
  const std::string tmp = dir + ".tmp";
  const auto layouts = internal::ParamLayouts(root, world.rank());
  std::string error;
  if (world.rank() == 0) {
    try {
      internal::BeginSave(dir);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  internal::ShareRank0Error(error, world, dir + ": rank 0 cannot save a checkpoint there");

  // Optimizer state is saved for a parameter only if every rank has it:
  // tensor-parallel parameters are gathered, and every rank must take part.
  std::vector<c10::optional<ParamState>> states(layouts.size());
  at::Tensor missing = at::zeros({static_cast<int64_t>(layouts.size()) + 1}, at::kDouble);
  for (size_t i = 0; i < layouts.size(); ++i) {
    if (optimizer) states[i] = GetState(*optimizer, layouts[i].shard.shard);
    missing[i] = states[i].has_value() ? 0.0 : 1.0;
  }
  world.group()->all_reduce(missing, comm::ReduceOp::kMax).wait();

  NamedTensors tensors;
  std::map<std::string, std::string> meta;
  internal::HostStaging staging;  // copies in host memory, GPU ones pinned
  for (size_t i = 0; i < layouts.size(); ++i) {
    const auto& l = layouts[i];
    const auto& s = l.shard;
    if (missing[i].item<double>() != 0) states[i].reset();
    // Rows of the full parameter this rank writes, as [rows, row_numel]:
    // its FSDP rows, or for a tensor-parallel parameter (gathered whole) an
    // even share of the full rows, so that the file holds every parameter
    // under its own name and full shape whatever the (dp, tp) layout.
    std::function<at::Tensor(const at::Tensor&)> rows;
    int64_t row_start = s.row_start;
    if (l.tp) {
      const int64_t full_rows = l.full_shape.empty() ? 1 : l.full_shape[0];
      const int64_t per_rank = (full_rows + world.size() - 1) / world.size();
      row_start = std::min(full_rows, per_rank * world.rank());
      const int64_t n = std::min(full_rows - row_start, per_rank);
      rows = [&l, &staging, row_start, n, full_rows](const at::Tensor& local) {
        at::Tensor full = internal::GatherFull(l, local);  // collective
        return staging.Stage(
            full.reshape({full_rows, RowNumel(l.full_shape)}).narrow(0, row_start, n),
            /*live=*/true);  // a copy: the rest of `full` is not kept
      };
    } else if (l.writes_rows) {
      rows = [&s, &staging, snapshot](const at::Tensor& local) {
        return snapshot ? staging.Stage(AsRows(local, s), /*live=*/true) : AsRows(local, s);
      };
    }
    at::Tensor param = rows ? rows(s.shard) : at::Tensor();
    const bool write = param.defined() && param.size(0) > 0;
    if (write) {
      tensors.emplace_back("model/" + s.name, param);
      meta["row_start/" + s.name] = std::to_string(row_start);
    }
    if (!states[i]) continue;
    if (write) meta["step/" + s.name] = std::to_string(states[i]->step);
    for (const auto& [key, t] : states[i]->tensors) {
      at::Tensor state = rows ? rows(t) : at::Tensor();
      if (write) tensors.emplace_back("optim/" + key + "/" + s.name, state);
    }
  }
  nlohmann::json m;
  if (world.rank() == 0) {
    m["format"] = kFormat;
    m["world_size"] = world.size();
    m["optimizer"] = kind;
    m["progress"] = progress;
    if (optimizer != nullptr) {
      m["optimizer_groups"] = nlohmann::json::parse(internal::GroupOptionsJson(*optimizer, kind));
    }
    for (const auto& l : layouts) {
      m["params"][l.shard.name] = {{"shape", l.full_shape},
                                   {"dtype", c10::toString(l.shard.shard.scalar_type())}};
    }
  }
  staging.Done();
  // What is left writes files only: no collective, any thread.
  const int rank = world.rank(), n = world.size();
  return [dir, tmp, tensors = std::move(tensors), meta = std::move(meta), m = std::move(m), rank,
          n, wait_for_ranks, staging]() mutable {
    staging.Wait();
    WriteSafetensors(tmp + "/" + ShardFile(rank, n), tensors, meta);
    if (rank != 0) return;
    // Every rank's file appears (atomically) once it is complete.
    const auto deadline = std::chrono::steady_clock::now() + wait_for_ranks;
    for (int r = 0; r < n; ++r) {
      while (!fs::exists(tmp + "/" + ShardFile(r, n))) {
        if (std::chrono::steady_clock::now() > deadline) {
          throw IoError(dir + ": rank " + std::to_string(r) + " did not write its shard file");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    // Which rows of which parameter each file holds.
    for (int r = 0; r < n; ++r) {
      const std::string file = ShardFile(r, n);
      SafetensorsFile f(tmp + "/" + file);
      m["files"][file] = nlohmann::json::object();
      for (const auto& [name, info] : f.tensors()) {
        if (name.rfind("model/", 0) != 0) continue;
        const std::string param = name.substr(6);
        m["files"][file][param] = {std::stoll(f.metadata().at("row_start/" + param)),
                                   info.shape.empty() ? 1 : info.shape[0]};
      }
    }
    WriteFileAtomically(tmp + "/metadata.json", m.dump(2));
    // Swap in the complete directory; a crash before this leaves DIR as it was.
    internal::CommitSave(dir);
  };
}

}  // namespace

void SaveShardedCheckpoint(const std::string& dir, torch::nn::Module& root,
                           torch::optim::Optimizer* optimizer, comm::World& world,
                           const std::map<std::string, std::string>& progress) {
  Stage(dir, root, optimizer, world, progress, std::chrono::minutes(30),
        /*snapshot=*/false)();
  world.group()->barrier().wait();
}

PendingWrite StageShardedCheckpoint(const std::string& dir, torch::nn::Module& root,
                                    torch::optim::Optimizer* optimizer, comm::World& world,
                                    const std::map<std::string, std::string>& progress,
                                    std::chrono::milliseconds wait_for_ranks) {
  return Stage(dir, root, optimizer, world, progress, wait_for_ranks, /*snapshot=*/true);
}

std::map<std::string, std::string> LoadShardedCheckpoint(
    const std::string& dir, torch::nn::Module& root, torch::optim::Optimizer* optimizer,
    comm::World& world) {
  if (world.rank() == 0) RecoverInterruptedSwap(dir);
  world.group()->barrier().wait();
  if (!fs::is_directory(dir)) {
    throw IoError(dir + ": " + (fs::exists(dir) ? "is a file, expected a checkpoint directory"
                                                           : "no such checkpoint directory"));
  }
  const std::string meta_path = dir + "/metadata.json";
  std::ifstream in(meta_path);
  if (!in) throw IoError(meta_path + ": missing: not an fsdp2 sharded checkpoint");
  nlohmann::json m;
  try {
    in >> m;
  } catch (const std::exception&) {
    throw IoError(meta_path + ": not valid JSON");
  }
  if (m.value("format", "") != kFormat) {
    throw IoError(meta_path + ": not an fsdp2 sharded checkpoint (format '" +
                             m.value("format", "") + "')");
  }
  const std::string kind = m.at("optimizer").get<std::string>();
  if (optimizer != nullptr && kind != OptimizerKind(optimizer)) {
    throw IoError(dir + ": holds " + kind + " optimizer state but the optimizer is " +
                             OptimizerKind(optimizer));
  }
  const int saved_world = m.at("world_size").get<int>();
  // Which file holds which rows of which tensor.
  struct Piece {
    const SafetensorsFile* file;
    size_t file_index;
    int64_t row_start;
    int64_t rows;
  };
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, std::vector<Piece>> pieces;
  std::map<std::string, int64_t> steps;
  for (int r = 0; r < saved_world; ++r) {
    const std::string path = dir + "/" + ShardFile(r, saved_world);
    if (!fs::exists(path)) throw IoError(path + ": missing shard file");
    files.push_back(std::make_unique<SafetensorsFile>(path));
    const auto& f = *files.back();
    for (const auto& [name, info] : f.tensors()) {
      // "model/<p>" or "optim/<key>/<p>": the parameter is after the prefix.
      const std::string p = name.rfind("model/", 0) == 0
                                ? name.substr(6)
                                : name.substr(name.find('/', 6) + 1);
      const int64_t start = std::stoll(f.metadata().at("row_start/" + p));
      pieces[name].push_back({&f, files.size() - 1, start, info.shape.empty() ? 1 : info.shape[0]});
      auto step = f.metadata().find("step/" + p);
      if (step != f.metadata().end()) steps[p] = std::stoll(step->second);
    }
  }
  // The rows this rank holds of each parameter: its FSDP rows, or all of a
  // tensor-parallel parameter's (it takes its block of the whole).
  const auto layouts = internal::ParamLayouts(root, world.rank());
  auto my_rows = [&](size_t i) -> std::pair<int64_t, int64_t> {
    const auto& l = layouts[i];
    if (l.tp) return {0, l.full_shape.empty() ? 1 : l.full_shape[0]};
    return {l.shard.row_start, l.shard.local_rows};
  };
  // Files this rank reads rows from (all the tensors of a file hold the
  // same rows of their parameters, so the model's tensors tell).
  std::vector<bool> reads_from(files.size(), false);
  for (size_t i = 0; i < layouts.size(); ++i) {
    const auto [start, rows] = my_rows(i);
    auto of_param = pieces.find("model/" + layouts[i].shard.name);
    if (of_param == pieces.end()) continue;  // the error comes below
    for (const auto& piece : of_param->second) {
      if (std::max(start, piece.row_start) < std::min(start + rows, piece.row_start + piece.rows)) {
        reads_from[piece.file_index] = true;
      }
    }
  }
  // Every tensor's checksum is verified once, whatever the loading world
  // size: rank r checks the files r, r + M, ... whole. All ranks learn of a
  // failure before anything is written. What a rank checked of the optimizer
  // state in a file it also reads rows from is kept (on the world size it
  // was saved on, rank r's rows are file r's), so those bytes come from the
  // disk once. The model's rows are only checked here and read once more at
  // the end, straight into the parameters: by then they are in the page
  // cache, and the parameters' memory is already there, where a kept copy
  // would be fresh memory, faulted in page by page, and a copy more.
  std::string corrupt;
  std::map<std::pair<size_t, std::string>, at::Tensor> checked;
  for (size_t i = world.rank(); i < files.size() && corrupt.empty(); i += world.size()) {
    try {
      files[i]->load_each(
          [&](const std::string& name, at::Tensor t) { checked[{i, name}] = std::move(t); },
          [&](const std::string& name) { return reads_from[i] && name.rfind("model/", 0) != 0; });
    } catch (const std::exception& e) {
      corrupt = e.what();
    }
  }
  internal::ThrowIfAnyRankFailed(
      corrupt, world, dir + ": a shard file is corrupted (another rank found a checksum mismatch)");
  // Everything is read and checked before anything is written.
  // Which rows of which files make rows [row_start, row_start + rows) of a
  // full tensor: every piece checked to have rows of the model's width, and
  // every row covered.
  struct Segment {
    const Piece* piece;
    int64_t lo, hi;  // rows of the full tensor
  };
  auto plan_rows = [&](const std::string& key, int64_t row_start, int64_t rows,
                       const std::vector<int64_t>& full_shape) {
    const int64_t width = RowNumel(full_shape);
    std::vector<Segment> plan;
    int64_t covered = 0;
    for (const auto& piece : pieces[key]) {
      const int64_t lo = std::max(row_start, piece.row_start);
      const int64_t hi = std::min(row_start + rows, piece.row_start + piece.rows);
      if (lo >= hi) continue;
      const int64_t numel = c10::multiply_integers(piece.file->info(key).shape);
      if (numel != piece.rows * width) {
        throw IoError(piece.file->path() + ": '" + key + "' has rows of " +
                      std::to_string(numel / std::max<int64_t>(1, piece.rows)) +
                      " elements, the model's have " + std::to_string(width));
      }
      plan.push_back({&piece, lo, hi});
      covered += hi - lo;
    }
    if (covered != rows) {
      throw IoError(dir + ": rows of '" + key + "' are missing from the shard files");
    }
    return plan;
  };
  // Rows [row_start, row_start + rows) of a full tensor, as [rows, width].
  auto read_rows = [&](const std::string& key, int64_t row_start, int64_t rows,
                       const std::vector<int64_t>& full_shape,
                       const at::TensorOptions& options) -> at::Tensor {
    const int64_t width = RowNumel(full_shape);
    at::Tensor out;
    for (const auto& [piece, lo, hi] : plan_rows(key, row_start, rows, full_shape)) {
      auto kept = checked.find({piece->file_index, key});
      at::Tensor part = kept != checked.end()
                            ? kept->second.reshape({piece->rows, width})
                                  .narrow(0, lo - piece->row_start, hi - lo)
                            : piece->file->load_rows(key, lo - piece->row_start, hi - lo)
                                  .reshape({hi - lo, width});
      // A whole piece that is all of the rows, as the model wants them: no
      // copy (and no larger tensor kept alive behind a view of part of it).
      if (hi - lo == rows && lo == piece->row_start && hi == piece->row_start + piece->rows &&
          part.scalar_type() == options.dtype() && options.device().is_cpu()) {
        return part;
      }
      if (!out.defined()) out = at::empty({rows, width}, options);
      out.narrow(0, lo - row_start, hi - lo).copy_(part);
    }
    return out.defined() ? out : at::empty({rows, width}, options);
  };
  std::vector<fsdp::ShardInfo> shards;
  for (const auto& l : layouts) shards.push_back(l.shard);
  // This rank's shard of a tensor: its FSDP rows, or for a tensor-parallel
  // parameter its block of the whole tensor.
  auto assemble = [&](const std::string& key, size_t i) -> at::Tensor {
    const auto& l = layouts[i];
    const auto& s = l.shard;
    if (l.tp) {
      const int64_t full_rows = l.full_shape.empty() ? 1 : l.full_shape[0];
      return internal::LocalOfFull(
          l, read_rows(key, 0, full_rows, l.full_shape, s.shard.options()).view(l.full_shape));
    }
    return read_rows(key, s.row_start, s.local_rows, l.full_shape, s.shard.options())
        .view(s.shard.sizes());
  };
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  // Parameters whose rows are read from the files straight into them.
  struct DirectRead {
    const fsdp::ShardInfo* shard;
    std::string key;
    std::vector<Segment> plan;
  };
  std::vector<DirectRead> reads;
  std::vector<std::pair<const fsdp::ShardInfo*, ParamState>> states;
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto& s = shards[i];
    if (!m["params"].contains(s.name)) {
      throw IoError(dir + ": has no parameter '" + s.name + "'");
    }
    const auto shape = m["params"][s.name]["shape"].get<std::vector<int64_t>>();
    if (shape != layouts[i].full_shape) {
      throw IoError(dir + ": parameter '" + s.name + "' has shape " +
                               c10::str(at::IntArrayRef(shape)) + " but the model's is " +
                               c10::str(at::IntArrayRef(layouts[i].full_shape)));
    }
    const std::string dtype = m["params"][s.name].value("dtype", "");
    if (dtype != c10::toString(s.shard.scalar_type())) {
      throw IoError(dir + ": parameter '" + s.name + "' is " + dtype +
                               " but the model's is " + c10::toString(s.shard.scalar_type()));
    }
    const std::string model_key = "model/" + s.name;
    const auto& l = layouts[i];
    bool direct = internal::RowsReadInPlace(l);
    if (direct) {
      auto plan = plan_rows(model_key, s.row_start, s.local_rows, l.full_shape);
      for (const auto& segment : plan) {
        direct = direct && segment.piece->file->info(model_key).dtype == s.shard.scalar_type();
      }
      if (direct) reads.push_back({&s, model_key, std::move(plan)});
    }
    if (!direct) copies.emplace_back(s.shard, assemble(model_key, i));
    if (optimizer == nullptr || !steps.count(s.name)) continue;
    ParamState st;
    st.step = steps[s.name];
    for (const auto& key : internal::StateKeys()) {
      const std::string name = "optim/" + key + "/" + s.name;
      if (pieces.count(name)) {
        st.tensors[key] = assemble(name, i);
      }
    }
    states.emplace_back(&s, std::move(st));
  }
  checked.clear();  // what no parameter took
  for (const auto& item : m["params"].items()) {
    bool known = false;
    for (const auto& s : shards) known = known || s.name == item.key();
    if (!known) {
      throw IoError(dir + ": holds parameter '" + item.key() +
                               "', which the model does not have");
    }
  }
  if (optimizer != nullptr) {
    std::vector<std::pair<std::string, at::Tensor>> with_state;
    for (const auto& item : states) with_state.emplace_back(item.first->name, item.first->shard);
    internal::CheckOptimizerHolds(*optimizer, with_state, dir);
    if (m.contains("optimizer_groups")) {
      internal::SetGroupOptions(*optimizer, kind, m["optimizer_groups"].dump(), dir);
    }
  }
  // The files read below are the ones checked: fail before writing anything
  // where one was replaced or rewritten meanwhile.
  for (size_t i = 0; i < files.size(); ++i) {
    if (reads_from[i]) files[i]->check_unchanged();
  }
  std::string read_error;
  {
    at::NoGradGuard no_grad;
    for (auto& [target, value] : copies) target.copy_(value);
    try {
      for (const auto& r : reads) {
        const auto& s = *r.shard;
        if (s.local_rows == 0) continue;
        at::Tensor rows = s.shard.view({s.local_rows, -1});
        for (const auto& [piece, lo, hi] : r.plan) {
          piece->file->load_rows_into(r.key, lo - piece->row_start, hi - lo,
                                      rows.narrow(0, lo - s.row_start, hi - lo));
        }
      }
    } catch (const std::exception& e) {
      read_error = e.what();
    }
  }
  // A read that fails here (the disk, or a file changed in place after its
  // check) leaves parameters partly loaded, on this rank or another: every
  // rank says so.
  const std::string partly = "; the model's parameters are partly loaded: load a checkpoint again";
  internal::ThrowIfAnyRankFailed(read_error.empty() ? "" : read_error + partly, world,
                                 dir + ": another rank could not read its rows" + partly);
  for (auto& [s, st] : states) SetState(*optimizer, kind, s->shard, st);
  world.group()->barrier().wait();
  return m.value("progress", std::map<std::string, std::string>{});
}

void RemoveCheckpoint(const std::string& dir, comm::World& world) {
  world.group()->barrier().wait();
  std::string error;
  if (world.rank() == 0) {
    std::ifstream in(dir + "/metadata.json");
    nlohmann::json m;
    bool ok = false;
    if (in) {
      try {
        in >> m;
        ok = m.value("format", "") == kFormat;
      } catch (const std::exception&) {
      }
    }
    if (!ok) {
      error = dir + ": not an fsdp2 checkpoint; refusing to remove it";
    } else {
      const int n = m.at("world_size").get<int>();
      for (int r = 0; r < n; ++r) fs::remove(dir + "/" + ShardFile(r, n));
      fs::remove(dir + "/metadata.json");
      std::error_code ec;
      fs::remove(dir, ec);  // only if nothing else is left in it
    }
  }
  internal::ShareRank0Error(error, world,
                            dir + ": not an fsdp2 checkpoint; refusing to remove it");
}

}  // namespace checkpoint
}  // namespace fsdp2
