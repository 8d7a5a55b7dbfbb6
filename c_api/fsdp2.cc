// fsdp2/c_api/fsdp2.cc
//
// The C ABI's entry points (see fsdp2.h). Each one runs its body inside
// FSDP2_ENTRY, which turns every C++ exception into a status and this
// thread's last-error message. Handles are ids in a registry, not pointers:
// a destroyed handle is simply absent, so using it is an error, never a
// use-after-free.
#include "c_api/fsdp2.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/version.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "c_api/internal/builtin_modules.h"
#include "c_api/internal/errors.h"
#include "core/fsdp/fully_shard.h"
#include "core/launch/local_launcher.h"
#include "core/strategy/cluster_environment.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/tp/state_dict.h"

// The handle types are incomplete in the header; here each is an id.
struct fsdp2_strategy {};
struct fsdp2_model {};
struct fsdp2_dataloader {};

namespace fsdp2 {
namespace c_api {
namespace {

thread_local std::string last_error;

// ---------------------------------------------------------------------------
// Errors

fsdp2_status_t Fail(fsdp2_status_t status, const std::string& message) {
  last_error = message;
  return status;
}

// Classifies the exception in flight (call from a catch block).
fsdp2_status_t TranslateException(fsdp2_status_t runtime_status = FSDP2_ERROR_RUNTIME) {
  try {
    throw;
  } catch (const HandleError& e) {
    return Fail(FSDP2_ERROR_INVALID_HANDLE, e.what());
  } catch (const ShapeError& e) {
    return Fail(FSDP2_ERROR_SHAPE, e.what());
  } catch (const IoError& e) {
    return Fail(FSDP2_ERROR_IO, e.what());
  } catch (const std::invalid_argument& e) {
    return Fail(FSDP2_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const std::out_of_range& e) {
    return Fail(FSDP2_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const std::logic_error& e) {
    return Fail(FSDP2_ERROR_WRONG_ORDER, e.what());
  } catch (const std::bad_alloc&) {
    return Fail(FSDP2_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const c10::Error& e) {
    return Fail(runtime_status, e.what_without_backtrace());
  } catch (const std::filesystem::filesystem_error& e) {
    return Fail(FSDP2_ERROR_IO, e.what());
  } catch (const std::exception& e) {
    return Fail(runtime_status, e.what());
  } catch (...) {
    return Fail(FSDP2_ERROR_INTERNAL, "unknown exception");
  }
}

// Runs `body`; any exception becomes a status.
#define FSDP2_ENTRY(...)              \
  try {                               \
    __VA_ARGS__;                      \
    return FSDP2_OK;                  \
  } catch (...) {                     \
    return TranslateException();      \
  }

// As FSDP2_ENTRY, for file operations: runtime failures are I/O errors.
#define FSDP2_FILE_ENTRY(...)                        \
  try {                                              \
    __VA_ARGS__;                                     \
    return FSDP2_OK;                                 \
  } catch (...) {                                    \
    return TranslateException(FSDP2_ERROR_IO);       \
  }

void Require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

template <typename T>
T* NotNull(T* p, const char* what) {
  if (p == nullptr) throw std::invalid_argument(std::string(what) + " is NULL");
  return p;
}

// ---------------------------------------------------------------------------
// Handles

struct StrategyState {
  std::unique_ptr<strategy::FSDP2Strategy> strategy;
  std::shared_ptr<BuiltinModule> module;
  // After parallelize: every parameter's name and global shape.
  std::vector<std::string> param_names;
  std::vector<std::vector<int64_t>> param_shapes;
  std::vector<at::ScalarType> param_dtypes;
};

struct ModelState {
  std::shared_ptr<BuiltinModule> module;
};

struct LoaderState {
  std::unique_ptr<strategy::DataLoader> loader;  // rows: windows of block+1
  int32_t token_dtype = FSDP2_DTYPE_UINT8;
  int64_t block_size = 0;
};

enum class Kind { kStrategy, kModel, kLoader };

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kStrategy: return "fsdp2_strategy_t";
    case Kind::kModel: return "fsdp2_model_t";
    case Kind::kLoader: return "fsdp2_dataloader_t";
  }
  return "?";
}

class Registry {
 public:
  static Registry& Get() {
    static Registry* registry = new Registry();  // never destroyed: atexit-safe
    return *registry;
  }

  uintptr_t Add(Kind kind, std::shared_ptr<void> object) {
    std::lock_guard<std::mutex> lock(mu_);
    const uintptr_t id = next_id_;
    next_id_ += 16;  // looks like an aligned pointer; never reused
    entries_[id] = {kind, std::move(object)};
    return id;
  }

  // The live object of `kind` behind `id`; throws HandleError otherwise.
  std::shared_ptr<void> Find(uintptr_t id, Kind kind) {
    if (id == 0) throw HandleError(std::string(KindName(kind)) + " handle is NULL");
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      throw HandleError(std::string(KindName(kind)) +
                        " handle is not live: it was destroyed or never created");
    }
    if (it->second.first != kind) {
      throw HandleError(std::string("expected a ") + KindName(kind) + " handle, got a " +
                        KindName(it->second.first));
    }
    return it->second.second;
  }

  // Removes and returns the object (null if absent or of another kind).
  std::shared_ptr<void> Remove(uintptr_t id, Kind kind) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.first != kind) return nullptr;
    std::shared_ptr<void> object = std::move(it->second.second);
    entries_.erase(it);
    return object;
  }

 private:
  std::mutex mu_;
  uintptr_t next_id_ = 0x10000;
  std::unordered_map<uintptr_t, std::pair<Kind, std::shared_ptr<void>>> entries_;
};

template <typename Handle>
uintptr_t IdOf(const Handle* handle) {
  return reinterpret_cast<uintptr_t>(handle);
}

std::shared_ptr<StrategyState> GetStrategy(const fsdp2_strategy_t* h) {
  return std::static_pointer_cast<StrategyState>(Registry::Get().Find(IdOf(h), Kind::kStrategy));
}
std::shared_ptr<ModelState> GetModel(const fsdp2_model_t* h) {
  return std::static_pointer_cast<ModelState>(Registry::Get().Find(IdOf(h), Kind::kModel));
}
std::shared_ptr<LoaderState> GetLoader(const fsdp2_dataloader_t* h) {
  return std::static_pointer_cast<LoaderState>(Registry::Get().Find(IdOf(h), Kind::kLoader));
}

template <typename Handle>
Handle* NewHandle(Kind kind, std::shared_ptr<void> object) {
  return reinterpret_cast<Handle*>(Registry::Get().Add(kind, std::move(object)));
}

// ---------------------------------------------------------------------------
// Tensors

at::ScalarType ToScalarType(int32_t dtype) {
  switch (dtype) {
    case FSDP2_DTYPE_FLOAT32: return at::kFloat;
    case FSDP2_DTYPE_FLOAT64: return at::kDouble;
    case FSDP2_DTYPE_BFLOAT16: return at::kBFloat16;
    case FSDP2_DTYPE_FLOAT16: return at::kHalf;
    case FSDP2_DTYPE_INT64: return at::kLong;
    case FSDP2_DTYPE_INT32: return at::kInt;
    case FSDP2_DTYPE_UINT8: return at::kByte;
    case FSDP2_DTYPE_UINT16: break;  // LibTorch 1.13 has no uint16 tensors
  }
  throw std::invalid_argument("dtype " + std::to_string(static_cast<int>(dtype)) +
                              " is not supported for tensors (UINT16 is for token files)");
}

int32_t FromScalarType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return FSDP2_DTYPE_FLOAT32;
    case at::kDouble: return FSDP2_DTYPE_FLOAT64;
    case at::kBFloat16: return FSDP2_DTYPE_BFLOAT16;
    case at::kHalf: return FSDP2_DTYPE_FLOAT16;
    case at::kLong: return FSDP2_DTYPE_INT64;
    case at::kInt: return FSDP2_DTYPE_INT32;
    case at::kByte: return FSDP2_DTYPE_UINT8;
    default: break;
  }
  throw std::invalid_argument(std::string("no C dtype for ") + c10::toString(t));
}

std::string Describe(const fsdp2_tensor_t& t) {
  std::ostringstream s;
  s << "[";
  for (int32_t d = 0; d < t.ndim && d < FSDP2_MAX_DIMS; ++d) s << (d ? ", " : "") << t.shape[d];
  s << "] dtype " << static_cast<int>(t.dtype);
  return s.str();
}

std::vector<int64_t> ShapeOf(const fsdp2_tensor_t& t, const std::string& what) {
  if (t.ndim < 0 || t.ndim > FSDP2_MAX_DIMS) {
    throw ShapeError(what + ": ndim " + std::to_string(t.ndim) + " is outside 0.." +
                     std::to_string(FSDP2_MAX_DIMS));
  }
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  for (int64_t s : shape) {
    if (s < 0) throw ShapeError(what + ": negative size in shape " + Describe(t));
  }
  return shape;
}

// A tensor over the caller's buffer (no copy; valid during the call).
at::Tensor Borrow(const fsdp2_tensor_t& t, const std::string& what) {
  std::vector<int64_t> shape = ShapeOf(t, what);
  const at::ScalarType type = ToScalarType(t.dtype);
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel > 0 && t.data == nullptr) throw std::invalid_argument(what + ": data is NULL");
  if (numel == 0) return at::empty(shape, at::TensorOptions().dtype(type));
  return at::from_blob(t.data, shape, at::TensorOptions().dtype(type));
}

strategy::Batch BorrowBatch(const fsdp2_tensor_t* batch, size_t n) {
  Require(n == 0 || batch != nullptr, "batch is NULL but num_tensors is " + std::to_string(n));
  Require(n > 0, "the batch has no tensors");
  strategy::Batch out;
  for (size_t i = 0; i < n; ++i) out.push_back(Borrow(batch[i], "batch[" + std::to_string(i) + "]"));
  return out;
}

// Copies `value` into the caller's `out`, whose dtype and shape must match.
void CopyOut(const at::Tensor& value, fsdp2_tensor_t* out, const std::string& what) {
  NotNull(out, what.c_str());
  const std::vector<int64_t> shape = ShapeOf(*out, what);
  if (out->dtype != FromScalarType(value.scalar_type()) || !value.sizes().equals(shape)) {
    std::ostringstream s;
    s << what << ": the buffer is " << Describe(*out) << ", the value is " << value.sizes()
      << " dtype " << static_cast<int>(FromScalarType(value.scalar_type())) << " ("
      << c10::toString(value.scalar_type()) << ")";
    throw ShapeError(s.str());
  }
  if (value.numel() == 0) return;
  NotNull(out->data, (what + " data").c_str());
  at::from_blob(out->data, shape, value.options().dtype(value.scalar_type())).copy_(value);
}

// ---------------------------------------------------------------------------
// Options

template <typename Options>
void CopyGrown(Options* dst, const Options* src) {
  // Fields beyond the caller's struct_size keep dst's (default) values.
  const size_t n = std::min(src->struct_size, sizeof(Options));
  Require(src->struct_size >= sizeof(size_t),
          "options.struct_size is " + std::to_string(src->struct_size) +
              "; set it to sizeof the struct (call the *_init function first)");
  std::memcpy(static_cast<void*>(dst), src, n);
  dst->struct_size = sizeof(Options);
}

nlohmann::json ParseObject(const char* json, const char* what) {
  NotNull(json, what);
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string(what) + " is not valid JSON: " + e.what());
  }
  if (!value.is_object()) throw std::invalid_argument(std::string(what) + " must be a JSON object");
  return value;
}

int32_t JsonSize(const nlohmann::json& v, const std::string& key) {
  if (v.is_string() && v.get<std::string>() == "auto") return 0;
  if (v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() < (1 << 30)) {
    return static_cast<int32_t>(v.get<int64_t>());
  }
  throw std::invalid_argument("\"" + key + "\" must be \"auto\" or a positive integer, got " +
                              v.dump());
}

template <typename T>
T JsonNumber(const nlohmann::json& v, const std::string& key) {
  if (std::is_unsigned<T>::value && v.is_number_integer() && v.get<int64_t>() < 0 &&
      !v.is_number_unsigned()) {
    throw std::invalid_argument("\"" + key + "\" must not be negative, got " + v.dump());
  }
  if (!v.is_number()) {
    throw std::invalid_argument("\"" + key + "\" must be a number, got " + v.dump());
  }
  if (std::is_integral<T>::value && !v.is_number_integer()) {
    throw std::invalid_argument("\"" + key + "\" must be an integer, got " + v.dump());
  }
  return v.get<T>();
}

int32_t JsonBool(const nlohmann::json& v, const std::string& key) {
  if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
  if (v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1)) {
    return static_cast<int32_t>(v.get<int64_t>());
  }
  throw std::invalid_argument("\"" + key + "\" must be true or false, got " + v.dump());
}

template <typename E>
E JsonEnum(const nlohmann::json& v, const std::string& key,
           const std::vector<std::pair<const char*, E>>& names) {
  std::string known;
  for (const auto& [name, value] : names) {
    if (v.is_string() && v.get<std::string>() == name) return value;
    known += (known.empty() ? "" : ", ") + std::string(name);
  }
  throw std::invalid_argument("\"" + key + "\" must be one of " + known + ", got " + v.dump());
}

void UnknownKey(const std::string& key, const char* known) {
  throw std::invalid_argument("unknown option \"" + key + "\" (known: " + known + ")");
}

strategy::FSDP2StrategyOptions ToStrategyOptions(const fsdp2_strategy_options_t& o) {
  strategy::FSDP2StrategyOptions out;
  Require(o.data_parallel_size >= 0, "data_parallel_size must be 0 (auto) or positive, got " +
                                         std::to_string(o.data_parallel_size));
  Require(o.tensor_parallel_size >= 0, "tensor_parallel_size must be 0 (auto) or positive, got " +
                                           std::to_string(o.tensor_parallel_size));
  if (o.data_parallel_size > 0) out.data_parallel_size = strategy::ParallelSize::Of(o.data_parallel_size);
  if (o.tensor_parallel_size > 0) {
    out.tensor_parallel_size = strategy::ParallelSize::Of(o.tensor_parallel_size);
  }
  switch (o.sharding_strategy) {
    case FSDP2_FULL_SHARD: out.sharding_strategy = fsdp::ShardingStrategy::kFullShard; break;
    case FSDP2_SHARD_GRAD_OP: out.sharding_strategy = fsdp::ShardingStrategy::kShardGradOp; break;
    case FSDP2_NO_SHARD: out.sharding_strategy = fsdp::ShardingStrategy::kNoShard; break;
    case FSDP2_HYBRID_SHARD: out.sharding_strategy = fsdp::ShardingStrategy::kHybridShard; break;
    default:
      throw std::invalid_argument("unknown sharding_strategy " +
                                  std::to_string(o.sharding_strategy));
  }
  Require(o.reshard_after_forward >= -1 && o.reshard_after_forward <= 1,
          "reshard_after_forward must be -1 (default), 0 or 1");
  if (o.reshard_after_forward >= 0) out.reshard_after_forward = o.reshard_after_forward == 1;
  out.shard_group_size = o.shard_group_size;
  switch (o.precision) {
    case FSDP2_PRECISION_FP32: out.mp_policy = fsdp::MixedPrecisionPolicy{}; break;
    case FSDP2_PRECISION_BF16: out.mp_policy = strategy::DefaultMixedPrecision(); break;
    default:
      throw std::invalid_argument("unknown precision " + std::to_string(static_cast<int>(o.precision)));
  }
  out.cpu_offload = o.cpu_offload != 0;
  switch (o.backend) {
    case FSDP2_BACKEND_GLOO: out.backend = "gloo"; break;
    case FSDP2_BACKEND_NCCL: out.backend = "nccl"; break;
    default:
      throw std::invalid_argument("unknown backend " + std::to_string(static_cast<int>(o.backend)));
  }
  Require(o.timeout_ms > 0, "timeout_ms must be positive, got " + std::to_string(o.timeout_ms));
  out.timeout = std::chrono::milliseconds(o.timeout_ms);
  switch (o.checkpoint_format) {
    case FSDP2_CHECKPOINT_SHARDED: out.checkpoint_format = "sharded"; break;
    case FSDP2_CHECKPOINT_FULL: out.checkpoint_format = "full"; break;
    default:
      throw std::invalid_argument("unknown checkpoint_format " +
                                  std::to_string(static_cast<int>(o.checkpoint_format)));
  }
  out.seed = o.seed;
  out.data_sampler.seed = o.seed;
  out.data_sampler.shuffle = o.shuffle != 0;
  out.data_sampler.drop_last = o.drop_last != 0;
  return out;
}

// ---------------------------------------------------------------------------
// Steps

StrategyState& Parallelized(StrategyState& s, const char* what) {
  if (s.param_names.empty()) {
    throw std::logic_error(std::string(what) +
                           ": call fsdp2_strategy_connect and fsdp2_strategy_parallelize first");
  }
  return s;
}

fsdp2_step_options_t StepOptions(const fsdp2_step_options_t* options) {
  fsdp2_step_options_t o;
  fsdp2_step_options_init(&o);
  if (options != nullptr) CopyGrown(&o, options);
  Require(o.accumulate_grad_batches >= 1, "accumulate_grad_batches must be at least 1, got " +
                                              std::to_string(o.accumulate_grad_batches));
  Require(o.gradient_clip_val >= 0 && std::isfinite(o.gradient_clip_val),
          "gradient_clip_val must be 0 (off) or a positive number");
  return o;
}

fsdp2_step_result_t TrainingStep(StrategyState& s, const strategy::Batch& batch,
                                 int64_t batch_idx, const fsdp2_step_options_t& o) {
  Parallelized(s, "fsdp2_strategy_training_step");
  s.module->CheckBatch(batch);
  const int64_t rows = batch[0].size(0);
  const int k = o.accumulate_grad_batches;
  for (const auto& t : batch) {
    if (t.dim() == 0 || t.size(0) != rows) {
      throw ShapeError("every batch tensor needs the same first dimension (rows)");
    }
  }
  if (rows % k != 0 || rows == 0) {
    throw ShapeError("the batch's " + std::to_string(rows) +
                     " rows do not split into accumulate_grad_batches = " + std::to_string(k) +
                     " equal, non-empty micro-batches");
  }
  auto& st = *s.strategy;
  double loss_sum = 0;
  for (int i = 0; i < k; ++i) {
    strategy::Batch micro;
    for (const auto& t : batch) micro.push_back(t.narrow(0, i * (rows / k), rows / k));
    at::Tensor loss = st.training_step(micro, batch_idx);
    st.backward(loss / k, /*sync_gradients=*/i == k - 1);
    loss_sum += loss.item<double>();
  }
  fsdp2_step_result_t result{};
  result.grad_norm = st.optimizer_step(o.gradient_clip_val);
  result.loss = st.reduce(at::scalar_tensor(loss_sum / k, at::kDouble), /*mean=*/true)
                    .item<double>();
  result.step = st.current_epoch_step().step;
  return result;
}

double EvaluationStep(StrategyState& s, const strategy::Batch& batch, int64_t batch_idx,
                      bool test) {
  Parallelized(s, test ? "fsdp2_strategy_test_step" : "fsdp2_strategy_validation_step");
  s.module->CheckBatch(batch);
  at::Tensor loss = test ? s.strategy->test_step(batch, batch_idx)
                         : s.strategy->validation_step(batch, batch_idx);
  return loss.item<double>();
}

int64_t ParamIndex(const StrategyState& s, const char* name) {
  NotNull(name, "name");
  for (size_t i = 0; i < s.param_names.size(); ++i) {
    if (s.param_names[i] == name) return static_cast<int64_t>(i);
  }
  throw std::invalid_argument(std::string("the model has no parameter named '") + name +
                              "' (see fsdp2_strategy_parameter_info)");
}

strategy::Batch LoaderBatch(const LoaderState& l, int64_t batch_idx) {
  Require(batch_idx >= 0 && batch_idx < l.loader->num_batches(),
          "batch_idx " + std::to_string(batch_idx) + " is outside the loader's " +
              std::to_string(l.loader->num_batches()) + " batches");
  at::Tensor windows = l.loader->batch(batch_idx)[0].to(at::kLong);
  if (l.token_dtype == FSDP2_DTYPE_UINT16) windows = windows.bitwise_and(0xFFFF);
  return {windows.narrow(1, 0, l.block_size), windows.narrow(1, 1, l.block_size)};
}

}  // namespace
}  // namespace c_api
}  // namespace fsdp2

using namespace fsdp2::c_api;  // NOLINT: the entry points below are C

extern "C" {

const char* fsdp2_last_error(void) { return last_error.c_str(); }

const char* fsdp2_status_name(int32_t status) {
  switch (status) {
    case FSDP2_OK: return "FSDP2_OK";
    case FSDP2_ERROR_INVALID_ARGUMENT: return "FSDP2_ERROR_INVALID_ARGUMENT";
    case FSDP2_ERROR_INVALID_HANDLE: return "FSDP2_ERROR_INVALID_HANDLE";
    case FSDP2_ERROR_WRONG_ORDER: return "FSDP2_ERROR_WRONG_ORDER";
    case FSDP2_ERROR_SHAPE: return "FSDP2_ERROR_SHAPE";
    case FSDP2_ERROR_IO: return "FSDP2_ERROR_IO";
    case FSDP2_ERROR_RUNTIME: return "FSDP2_ERROR_RUNTIME";
    case FSDP2_ERROR_OUT_OF_MEMORY: return "FSDP2_ERROR_OUT_OF_MEMORY";
    case FSDP2_ERROR_INTERNAL: return "FSDP2_ERROR_INTERNAL";
  }
  return "FSDP2_ERROR_UNKNOWN";
}

int32_t fsdp2_abi_version(void) { return FSDP2_ABI_VERSION; }

const char* fsdp2_version_string(void) {
  static const std::string version =
      std::string("fsdp2 " FSDP2_VERSION " (LibTorch " TORCH_VERSION ", ") +
#ifdef FSDP2_WITH_CUDA
      "cuda"
#else
      "cpu"
#endif
      + ")";
  return version.c_str();
}

void fsdp2_free(void* pointer) { std::free(pointer); }

size_t fsdp2_dtype_size(int32_t dtype) {
  switch (dtype) {
    case FSDP2_DTYPE_FLOAT64:
    case FSDP2_DTYPE_INT64: return 8;
    case FSDP2_DTYPE_FLOAT32:
    case FSDP2_DTYPE_INT32: return 4;
    case FSDP2_DTYPE_BFLOAT16:
    case FSDP2_DTYPE_FLOAT16:
    case FSDP2_DTYPE_UINT16: return 2;
    case FSDP2_DTYPE_UINT8: return 1;
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Launching

fsdp2_status_t fsdp2_is_rank_process(int32_t* is_rank) {
  FSDP2_ENTRY({
    NotNull(is_rank, "is_rank");
    *is_rank = fsdp2::strategy::ClusterEnvironment::Detect().kind !=
                       fsdp2::strategy::ClusterKind::kLocal
                   ? 1
                   : 0;
  })
}

fsdp2_status_t fsdp2_launch_local(int32_t nproc, int32_t threads_per_rank, int argc,
                                  char** argv, int32_t* exit_code) {
  FSDP2_ENTRY({
    NotNull(exit_code, "exit_code");
    Require(argc >= 1 && argv != nullptr, "argv must hold at least the program name");
    Require(threads_per_rank >= 0, "threads_per_rank must be 0 (auto) or positive");
    fsdp2::launch::LocalLaunchOptions options;
    options.nproc = nproc;
    options.threads_per_rank = threads_per_rank;
    for (int i = 0; i < argc; ++i) options.argv.push_back(NotNull(argv[i], "argv[i]"));
    *exit_code = fsdp2::launch::LaunchLocal(options);
  })
}

// ---------------------------------------------------------------------------
// Options

void fsdp2_strategy_options_init(fsdp2_strategy_options_t* o) {
  if (o == nullptr) return;
  std::memset(static_cast<void*>(o), 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->sharding_strategy = FSDP2_FULL_SHARD;
  o->reshard_after_forward = -1;
  o->precision = FSDP2_PRECISION_BF16;
  o->backend = FSDP2_BACKEND_GLOO;
  o->timeout_ms = 5 * 60 * 1000;
  o->checkpoint_format = FSDP2_CHECKPOINT_SHARDED;
  o->shuffle = 1;
  o->drop_last = 1;
}

fsdp2_status_t fsdp2_strategy_options_from_json(const char* json,
                                                fsdp2_strategy_options_t* options) {
  FSDP2_ENTRY({
    NotNull(options, "options");
    const nlohmann::json config = ParseObject(json, "strategy options");
    fsdp2_strategy_options_t o;
    fsdp2_strategy_options_init(&o);
    CopyGrown(&o, options);
    const char* known =
        "data_parallel_size, tensor_parallel_size, sharding_strategy, "
        "reshard_after_forward, shard_group_size, precision, cpu_offload, backend, "
        "timeout_ms, checkpoint_format, seed, shuffle, drop_last";
    for (const auto& [key, v] : config.items()) {
      if (key == "data_parallel_size") {
        o.data_parallel_size = JsonSize(v, key);
      } else if (key == "tensor_parallel_size") {
        o.tensor_parallel_size = JsonSize(v, key);
      } else if (key == "sharding_strategy") {
        o.sharding_strategy = JsonEnum<int32_t>(
            v, key, {{"full_shard", FSDP2_FULL_SHARD}, {"shard_grad_op", FSDP2_SHARD_GRAD_OP},
                     {"no_shard", FSDP2_NO_SHARD}, {"hybrid_shard", FSDP2_HYBRID_SHARD}});
      } else if (key == "reshard_after_forward") {
        o.reshard_after_forward = v.is_null() ? -1 : JsonBool(v, key);
      } else if (key == "shard_group_size") {
        o.shard_group_size = JsonNumber<int32_t>(v, key);
      } else if (key == "precision") {
        o.precision = JsonEnum<int32_t>(
            v, key, {{"fp32", FSDP2_PRECISION_FP32}, {"bf16", FSDP2_PRECISION_BF16}});
      } else if (key == "cpu_offload") {
        o.cpu_offload = JsonBool(v, key);
      } else if (key == "backend") {
        o.backend = JsonEnum<int32_t>(
            v, key, {{"gloo", FSDP2_BACKEND_GLOO}, {"nccl", FSDP2_BACKEND_NCCL}});
      } else if (key == "timeout_ms") {
        o.timeout_ms = JsonNumber<int64_t>(v, key);
      } else if (key == "checkpoint_format") {
        o.checkpoint_format = JsonEnum<int32_t>(
            v, key, {{"sharded", FSDP2_CHECKPOINT_SHARDED}, {"full", FSDP2_CHECKPOINT_FULL}});
      } else if (key == "seed") {
        o.seed = JsonNumber<uint64_t>(v, key);
      } else if (key == "shuffle") {
        o.shuffle = JsonBool(v, key);
      } else if (key == "drop_last") {
        o.drop_last = JsonBool(v, key);
      } else {
        UnknownKey(key, known);
      }
    }
    const size_t caller_size = options->struct_size;
    std::memcpy(static_cast<void*>(options), &o, std::min(caller_size, sizeof(o)));
    options->struct_size = caller_size;
  })
}

void fsdp2_optimizer_options_init(fsdp2_optimizer_options_t* o) {
  if (o == nullptr) return;
  std::memset(static_cast<void*>(o), 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->kind = FSDP2_OPTIMIZER_ADAMW;
  o->lr = 1e-3;
  o->beta1 = 0.9;
  o->beta2 = 0.999;
  o->eps = 1e-8;
  o->weight_decay = 0.01;
  o->momentum = 0;
}

fsdp2_status_t fsdp2_optimizer_options_from_json(const char* json,
                                                 fsdp2_optimizer_options_t* options) {
  FSDP2_ENTRY({
    NotNull(options, "options");
    const nlohmann::json config = ParseObject(json, "optimizer options");
    fsdp2_optimizer_options_t o;
    fsdp2_optimizer_options_init(&o);
    CopyGrown(&o, options);
    for (const auto& [key, v] : config.items()) {
      if (key == "kind") {
        o.kind = JsonEnum<int32_t>(
            v, key, {{"adamw", FSDP2_OPTIMIZER_ADAMW}, {"adam", FSDP2_OPTIMIZER_ADAM},
                     {"sgd", FSDP2_OPTIMIZER_SGD}});
      } else if (key == "lr") {
        o.lr = JsonNumber<double>(v, key);
      } else if (key == "beta1") {
        o.beta1 = JsonNumber<double>(v, key);
      } else if (key == "beta2") {
        o.beta2 = JsonNumber<double>(v, key);
      } else if (key == "eps") {
        o.eps = JsonNumber<double>(v, key);
      } else if (key == "weight_decay") {
        o.weight_decay = JsonNumber<double>(v, key);
      } else if (key == "momentum") {
        o.momentum = JsonNumber<double>(v, key);
      } else {
        UnknownKey(key, "kind, lr, beta1, beta2, eps, weight_decay, momentum");
      }
    }
    const size_t caller_size = options->struct_size;
    std::memcpy(static_cast<void*>(options), &o, std::min(caller_size, sizeof(o)));
    options->struct_size = caller_size;
  })
}

void fsdp2_step_options_init(fsdp2_step_options_t* o) {
  if (o == nullptr) return;
  std::memset(static_cast<void*>(o), 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->accumulate_grad_batches = 1;
  o->gradient_clip_val = 0;
}

void fsdp2_token_loader_options_init(fsdp2_token_loader_options_t* o) {
  if (o == nullptr) return;
  std::memset(static_cast<void*>(o), 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->token_dtype = FSDP2_DTYPE_UINT8;
  o->block_size = 64;
  o->global_batch_size = 8;
  o->begin_fraction = 0;
  o->end_fraction = 1;
}

// ---------------------------------------------------------------------------
// Models

fsdp2_status_t fsdp2_model_create(const char* config_json, fsdp2_model_t** out) {
  FSDP2_ENTRY({
    NotNull(out, "out");
    NotNull(config_json, "config_json");
    auto state = std::make_shared<ModelState>();
    state->module = CreateBuiltinModule(config_json);
    *out = NewHandle<fsdp2_model_t>(Kind::kModel, state);
  })
}

fsdp2_status_t fsdp2_model_create_deferred(fsdp2_strategy_t* strategy, const char* config_json,
                                           fsdp2_model_t** out) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    NotNull(out, "out");
    NotNull(config_json, "config_json");
    auto state = std::make_shared<ModelState>();
    {
      auto deferred = s->strategy->tensor_init_context();  // until the model is built
      state->module = CreateBuiltinModule(config_json);
    }
    *out = NewHandle<fsdp2_model_t>(Kind::kModel, state);
  })
}

fsdp2_status_t fsdp2_model_load_torchscript(const char* path, const char* loss,
                                            fsdp2_model_t** out) {
  FSDP2_FILE_ENTRY({
    NotNull(out, "out");
    NotNull(path, "path");
    NotNull(loss, "loss");
    auto state = std::make_shared<ModelState>();
    state->module = LoadTorchScriptModule(path, loss);
    *out = NewHandle<fsdp2_model_t>(Kind::kModel, state);
  })
}

void fsdp2_model_destroy(fsdp2_model_t* model) {
  if (model != nullptr) Registry::Get().Remove(IdOf(model), Kind::kModel);
}

fsdp2_status_t fsdp2_model_num_parameters(const fsdp2_model_t* model, int64_t* num_tensors,
                                          int64_t* num_elements) {
  FSDP2_ENTRY({
    auto m = GetModel(model);
    int64_t tensors = 0, elements = 0;
    // Under FSDP the registered parameters are shards: count global sizes.
    for (const auto& info : fsdp2::fsdp::shard_info(*m->module->module(), 0)) {
      int64_t n = 1;
      for (int64_t s : info.global_shape) n *= s;
      ++tensors;
      elements += n;
    }
    if (num_tensors) *num_tensors = tensors;
    if (num_elements) *num_elements = elements;
  })
}

// ---------------------------------------------------------------------------
// Strategy

fsdp2_status_t fsdp2_strategy_create(const fsdp2_strategy_options_t* options,
                                     fsdp2_strategy_t** out) {
  FSDP2_ENTRY({
    NotNull(out, "out");
    fsdp2_strategy_options_t o;
    fsdp2_strategy_options_init(&o);
    if (options != nullptr) CopyGrown(&o, options);
    auto state = std::make_shared<StrategyState>();
    state->strategy = std::make_unique<fsdp2::strategy::FSDP2Strategy>(ToStrategyOptions(o));
    *out = NewHandle<fsdp2_strategy_t>(Kind::kStrategy, state);
  })
}

void fsdp2_strategy_destroy(fsdp2_strategy_t* strategy) {
  if (strategy == nullptr) return;
  auto state = std::static_pointer_cast<StrategyState>(
      Registry::Get().Remove(IdOf(strategy), Kind::kStrategy));
  if (!state) return;
  try {
    state->strategy->teardown();
  } catch (...) {
    // Destroy never fails; the state goes away regardless.
  }
}

fsdp2_status_t fsdp2_strategy_setup_environment(fsdp2_strategy_t* strategy) {
  FSDP2_ENTRY(GetStrategy(strategy)->strategy->setup_environment())
}

fsdp2_status_t fsdp2_strategy_rank_info(const fsdp2_strategy_t* strategy, int32_t* rank,
                                        int32_t* world_size, int32_t* data_parallel_rank,
                                        int32_t* data_parallel_size) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    const auto& world = s->strategy->world();
    if (!world) throw std::logic_error("fsdp2_strategy_rank_info: call fsdp2_strategy_setup_environment first");
    const int32_t r = world->rank(), w = world->size();
    const int32_t dr = s->strategy->data_parallel_rank(), dw = s->strategy->data_parallel_size();
    if (rank) *rank = r;
    if (world_size) *world_size = w;
    if (data_parallel_rank) *data_parallel_rank = dr;
    if (data_parallel_size) *data_parallel_size = dw;
  })
}

fsdp2_status_t fsdp2_strategy_connect(fsdp2_strategy_t* strategy, fsdp2_model_t* model,
                                      const fsdp2_optimizer_options_t* optimizer) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    auto m = GetModel(model);
    if (s->module) {
      throw std::logic_error("fsdp2_strategy_connect: a model is already connected to this strategy");
    }
    fsdp2_optimizer_options_t o;
    fsdp2_optimizer_options_init(&o);
    if (optimizer != nullptr) CopyGrown(&o, optimizer);
    Require(o.kind >= FSDP2_OPTIMIZER_ADAMW && o.kind <= FSDP2_OPTIMIZER_SGD,
            "unknown optimizer kind " + std::to_string(static_cast<int>(o.kind)));
    Require(o.lr > 0 && std::isfinite(o.lr), "optimizer lr must be positive");
    Require(o.eps > 0 && o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1 &&
                o.weight_decay >= 0 && o.momentum >= 0,
            "optimizer options out of range: need eps > 0, 0 <= beta1, beta2 < 1, "
            "weight_decay >= 0, momentum >= 0");
    if (fsdp2::fsdp::unit_of(*m->module->module())) {
      throw std::logic_error("fsdp2_strategy_connect: this model is already parallelized by another strategy");
    }
    m->module->set_optimizer_options(o);
    s->strategy->connect(m->module);
    s->module = m->module;
  })
}

fsdp2_status_t fsdp2_strategy_parallelize(fsdp2_strategy_t* strategy) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    if (!s->param_names.empty()) {
      s->strategy->parallelize();  // warns and does nothing, as the spec says
      return FSDP2_OK;
    }
    // Names, shapes and dtypes as the user built the model: sharding (FSDP
    // rows, tensor-parallel blocks) keeps the names but not the shapes.
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    std::vector<at::ScalarType> dtypes;
    if (s->module && !fsdp2::fsdp::unit_of(*s->module->module())) {
      for (const auto& p : s->module->module()->named_parameters(/*recurse=*/true)) {
        names.push_back(p.key());
        shapes.push_back(p.value().sizes().vec());
        dtypes.push_back(p.value().scalar_type());
      }
    }
    s->strategy->parallelize();
    s->param_names = std::move(names);
    s->param_shapes = std::move(shapes);
    s->param_dtypes = std::move(dtypes);
  })
}

fsdp2_status_t fsdp2_strategy_training_step(fsdp2_strategy_t* strategy,
                                            const fsdp2_tensor_t* batch, size_t num_tensors,
                                            int64_t batch_idx,
                                            const fsdp2_step_options_t* options,
                                            fsdp2_step_result_t* result) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    const fsdp2_step_options_t o = StepOptions(options);
    const fsdp2_step_result_t r = TrainingStep(*s, BorrowBatch(batch, num_tensors), batch_idx, o);
    if (result) *result = r;
  })
}

fsdp2_status_t fsdp2_strategy_validation_step(fsdp2_strategy_t* strategy,
                                              const fsdp2_tensor_t* batch,
                                              size_t num_tensors, int64_t batch_idx,
                                              double* loss) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    NotNull(loss, "loss");
    *loss = EvaluationStep(*s, BorrowBatch(batch, num_tensors), batch_idx, /*test=*/false);
  })
}

fsdp2_status_t fsdp2_strategy_test_step(fsdp2_strategy_t* strategy, const fsdp2_tensor_t* batch,
                                        size_t num_tensors, int64_t batch_idx, double* loss) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    NotNull(loss, "loss");
    *loss = EvaluationStep(*s, BorrowBatch(batch, num_tensors), batch_idx, /*test=*/true);
  })
}

fsdp2_status_t fsdp2_strategy_predict_shape(fsdp2_strategy_t* strategy,
                                            const fsdp2_tensor_t* batch, size_t num_tensors,
                                            fsdp2_tensor_t* output) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    NotNull(output, "output");
    Parallelized(*s, "fsdp2_strategy_predict_shape");
    const std::vector<int64_t> shape = s->module->PredictShape(BorrowBatch(batch, num_tensors));
    if (shape.size() > FSDP2_MAX_DIMS) throw ShapeError("the prediction has too many dimensions");
    output->dtype = FSDP2_DTYPE_FLOAT32;
    output->ndim = static_cast<int32_t>(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) output->shape[d] = shape[d];
  })
}

fsdp2_status_t fsdp2_strategy_predict_step(fsdp2_strategy_t* strategy,
                                           const fsdp2_tensor_t* batch, size_t num_tensors,
                                           int64_t batch_idx, fsdp2_tensor_t* output) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    NotNull(output, "output");
    Parallelized(*s, "fsdp2_strategy_predict_step");
    const fsdp2::strategy::Batch b = BorrowBatch(batch, num_tensors);
    // Check the buffer before the (collective) forward would run.
    const std::vector<int64_t> shape = s->module->PredictShape(b);
    if (output->dtype != FSDP2_DTYPE_FLOAT32 || ShapeOf(*output, "output") != shape) {
      std::ostringstream m;
      m << "fsdp2_strategy_predict_step: the output buffer is " << Describe(*output)
        << ", the prediction is " << at::IntArrayRef(shape) << " float32 (dtype "
        << FSDP2_DTYPE_FLOAT32 << ")";
      throw ShapeError(m.str());
    }
    at::Tensor prediction = s->strategy->predict_step(b, batch_idx).to(at::kFloat);
    CopyOut(prediction, output, "output");
  })
}

fsdp2_status_t fsdp2_strategy_save_checkpoint(fsdp2_strategy_t* strategy, const char* path) {
  FSDP2_FILE_ENTRY({
    auto s = GetStrategy(strategy);
    NotNull(path, "path");
    Parallelized(*s, "fsdp2_strategy_save_checkpoint");
    s->strategy->save_checkpoint(path);
  })
}

fsdp2_status_t fsdp2_strategy_load_checkpoint(fsdp2_strategy_t* strategy, const char* path) {
  FSDP2_FILE_ENTRY({
    auto s = GetStrategy(strategy);
    NotNull(path, "path");
    Parallelized(*s, "fsdp2_strategy_load_checkpoint");
    s->strategy->load_checkpoint(path);
  })
}

fsdp2_status_t fsdp2_strategy_remove_checkpoint(fsdp2_strategy_t* strategy, const char* path) {
  FSDP2_FILE_ENTRY({
    auto s = GetStrategy(strategy);
    NotNull(path, "path");
    s->strategy->remove_checkpoint(path);
  })
}

fsdp2_status_t fsdp2_strategy_optimizer_state_dict(fsdp2_strategy_t* strategy, void** data,
                                                   size_t* size) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    NotNull(data, "data");
    NotNull(size, "size");
    Parallelized(*s, "fsdp2_strategy_optimizer_state_dict");
    const std::string state = s->strategy->optimizer_state_dict();
    void* buffer = std::malloc(state.empty() ? 1 : state.size());
    if (buffer == nullptr) throw std::bad_alloc();
    std::memcpy(buffer, state.data(), state.size());
    *data = buffer;
    *size = state.size();
  })
}

fsdp2_status_t fsdp2_strategy_load_optimizer_state_dict(fsdp2_strategy_t* strategy,
                                                        const void* data, size_t size) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    Require(data != nullptr && size > 0, "the optimizer state is empty (data NULL or size 0)");
    s->strategy->load_optimizer_state_dict(
        std::string(static_cast<const char*>(data), size));
  })
}

fsdp2_status_t fsdp2_strategy_has_pending_optimizer_state(const fsdp2_strategy_t* strategy,
                                                          int32_t* pending) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    NotNull(pending, "pending");
    *pending = s->strategy->has_pending_optimizer_state() ? 1 : 0;
  })
}

fsdp2_status_t fsdp2_strategy_num_parameters(const fsdp2_strategy_t* strategy, int64_t* count) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    NotNull(count, "count");
    Parallelized(*s, "fsdp2_strategy_num_parameters");
    *count = static_cast<int64_t>(s->param_names.size());
  })
}

fsdp2_status_t fsdp2_strategy_parameter_info(const fsdp2_strategy_t* strategy, int64_t index,
                                             const char** name, fsdp2_tensor_t* info) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    Parallelized(*s, "fsdp2_strategy_parameter_info");
    const int64_t n = static_cast<int64_t>(s->param_names.size());
    Require(index >= 0 && index < n, "parameter index " + std::to_string(index) +
                                         " is outside 0.." + std::to_string(n - 1));
    const auto& shape = s->param_shapes[index];
    if (shape.size() > FSDP2_MAX_DIMS) throw ShapeError("the parameter has too many dimensions");
    if (name) *name = s->param_names[index].c_str();
    if (info) {
      info->data = nullptr;
      info->dtype = FromScalarType(s->param_dtypes[index]);
      info->ndim = static_cast<int32_t>(shape.size());
      for (size_t d = 0; d < shape.size(); ++d) info->shape[d] = shape[d];
    }
  })
}

fsdp2_status_t fsdp2_strategy_get_parameter(fsdp2_strategy_t* strategy, const char* name,
                                            fsdp2_tensor_t* value) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    Parallelized(*s, "fsdp2_strategy_get_parameter");
    const int64_t index = ParamIndex(*s, name);
    NotNull(value, "value");
    // Check the buffer on every rank before the collective gather.
    const auto& shape = s->param_shapes[index];
    if (value->dtype != FromScalarType(s->param_dtypes[index]) ||
        ShapeOf(*value, "value") != shape) {
      std::ostringstream m;
      m << "fsdp2_strategy_get_parameter('" << name << "'): the buffer is " << Describe(*value)
        << ", the parameter is " << at::IntArrayRef(shape) << " dtype "
        << FromScalarType(s->param_dtypes[index]);
      throw ShapeError(m.str());
    }
    const int rank = s->strategy->world()->rank();
    torch::nn::Module& root = *s->module->module();
    for (const auto& info : fsdp2::fsdp::shard_info(root, rank)) {
      if (info.name != name) continue;
      // Undo the data-parallel rows, then the tensor-parallel blocks.
      fsdp2::tp::NamedTensors one{{info.name, fsdp2::fsdp::gather_rows(info, info.shard)}};
      fsdp2::tp::gather_tensor_parallel(root, one);
      CopyOut(one[0].second, value, "value");
      return FSDP2_OK;
    }
    throw std::logic_error(std::string("parameter '") + name + "' vanished from the model");
  })
}

fsdp2_status_t fsdp2_strategy_set_parameter(fsdp2_strategy_t* strategy, const char* name,
                                            const fsdp2_tensor_t* value) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    Parallelized(*s, "fsdp2_strategy_set_parameter");
    const int64_t index = ParamIndex(*s, name);
    NotNull(value, "value");
    at::Tensor full = Borrow(*value, "value");
    if (full.scalar_type() != s->param_dtypes[index] ||
        !full.sizes().equals(s->param_shapes[index])) {
      std::ostringstream m;
      m << "fsdp2_strategy_set_parameter('" << name << "'): the value is " << Describe(*value)
        << ", the parameter is " << at::IntArrayRef(s->param_shapes[index]) << " dtype "
        << FromScalarType(s->param_dtypes[index]);
      throw ShapeError(m.str());
    }
    s->strategy->load_model_state_dict({{name, full}}, /*strict=*/false);
  })
}

fsdp2_status_t fsdp2_strategy_current_epoch_step(const fsdp2_strategy_t* strategy,
                                                 int64_t* epoch, int64_t* step) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    const auto es = s->strategy->current_epoch_step();
    if (epoch) *epoch = es.epoch;
    if (step) *step = es.step;
  })
}

fsdp2_status_t fsdp2_strategy_set_epoch(fsdp2_strategy_t* strategy, int64_t epoch) {
  FSDP2_ENTRY({
    Require(epoch >= 0, "epoch must be non-negative");
    GetStrategy(strategy)->strategy->set_epoch(epoch);
  })
}

fsdp2_status_t fsdp2_strategy_barrier(fsdp2_strategy_t* strategy) {
  FSDP2_ENTRY(GetStrategy(strategy)->strategy->barrier())
}

fsdp2_status_t fsdp2_strategy_teardown(fsdp2_strategy_t* strategy) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    s->strategy->teardown();
  })
}

// ---------------------------------------------------------------------------
// Data loaders

fsdp2_status_t fsdp2_dataloader_create_from_token_file(
    fsdp2_strategy_t* strategy, const char* path, const fsdp2_token_loader_options_t* options,
    fsdp2_dataloader_t** out) {
  FSDP2_FILE_ENTRY({
    auto s = GetStrategy(strategy);
    NotNull(path, "path");
    NotNull(out, "out");
    fsdp2_token_loader_options_t o;
    fsdp2_token_loader_options_init(&o);
    if (options != nullptr) CopyGrown(&o, options);
    Require(o.token_dtype == FSDP2_DTYPE_UINT8 || o.token_dtype == FSDP2_DTYPE_UINT16 ||
                o.token_dtype == FSDP2_DTYPE_INT32,
            "token_dtype must be UINT8, UINT16 or INT32");
    Require(o.block_size >= 1, "block_size must be positive");
    Require(o.global_batch_size >= 1, "global_batch_size must be positive");
    Require(o.begin_fraction >= 0 && o.begin_fraction < o.end_fraction && o.end_fraction <= 1,
            "need 0 <= begin_fraction < end_fraction <= 1");
    if (!s->strategy->world()) {
      throw std::logic_error(
          "fsdp2_dataloader_create_from_token_file: call fsdp2_strategy_setup_environment first");
    }
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(std::string("cannot open token file ") + path + ": " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw IoError(std::string("token file ") + path + " is not a regular file");
    }
    const size_t bytes = static_cast<size_t>(st.st_size);
    const size_t item = fsdp2_dtype_size(o.token_dtype);
    if (bytes % item != 0) {
      ::close(fd);
      throw IoError(std::string("token file ") + path + " has " + std::to_string(bytes) +
                    " bytes, not a multiple of the token size " + std::to_string(item));
    }
    const int64_t tokens = static_cast<int64_t>(bytes / item);
    const int64_t window = o.block_size + 1;
    const int64_t all_rows = tokens / window;
    const int64_t first = static_cast<int64_t>(std::floor(o.begin_fraction * all_rows));
    const int64_t last = static_cast<int64_t>(std::floor(o.end_fraction * all_rows));
    if (last - first < o.global_batch_size) {
      ::close(fd);
      throw std::invalid_argument(
          std::string("token file ") + path + " holds " + std::to_string(last - first) +
          " windows of block_size + 1 = " + std::to_string(window) +
          " tokens in the chosen fraction, fewer than one global batch of " +
          std::to_string(o.global_batch_size));
    }
    void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) throw IoError(std::string("cannot map token file ") + path);
    const at::ScalarType type = o.token_dtype == FSDP2_DTYPE_UINT8    ? at::kByte
                                : o.token_dtype == FSDP2_DTYPE_UINT16 ? at::kShort
                                                                      : at::kInt;
    at::Tensor all = at::from_blob(
        map, {tokens}, [bytes](void* p) { ::munmap(p, bytes); },
        at::TensorOptions().dtype(type));
    at::Tensor windows =
        all.narrow(0, 0, all_rows * window).view({all_rows, window}).narrow(0, first, last - first);
    auto state = std::make_shared<LoaderState>();
    state->loader = std::make_unique<fsdp2::strategy::DataLoader>(
        s->strategy->process_dataloader({windows}, o.global_batch_size));
    state->token_dtype = o.token_dtype;
    state->block_size = o.block_size;
    *out = NewHandle<fsdp2_dataloader_t>(Kind::kLoader, state);
  })
}

void fsdp2_dataloader_destroy(fsdp2_dataloader_t* loader) {
  if (loader != nullptr) Registry::Get().Remove(IdOf(loader), Kind::kLoader);
}

fsdp2_status_t fsdp2_dataloader_num_batches(const fsdp2_dataloader_t* loader, int64_t* count) {
  FSDP2_ENTRY({
    auto l = GetLoader(loader);
    NotNull(count, "count");
    *count = l->loader->num_batches();
  })
}

fsdp2_status_t fsdp2_dataloader_set_epoch(fsdp2_dataloader_t* loader, int64_t epoch) {
  FSDP2_ENTRY({
    Require(epoch >= 0, "epoch must be non-negative");
    GetLoader(loader)->loader->set_epoch(epoch);
  })
}

fsdp2_status_t fsdp2_strategy_training_step_loader(fsdp2_strategy_t* strategy,
                                                   fsdp2_dataloader_t* loader,
                                                   int64_t batch_idx,
                                                   const fsdp2_step_options_t* options,
                                                   fsdp2_step_result_t* result) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    auto l = GetLoader(loader);
    const fsdp2_step_options_t o = StepOptions(options);
    const fsdp2_step_result_t r = TrainingStep(*s, LoaderBatch(*l, batch_idx), batch_idx, o);
    if (result) *result = r;
  })
}

fsdp2_status_t fsdp2_strategy_validation_step_loader(fsdp2_strategy_t* strategy,
                                                     fsdp2_dataloader_t* loader,
                                                     int64_t batch_idx, double* loss) {
  FSDP2_ENTRY({
    auto s = GetStrategy(strategy);
    auto l = GetLoader(loader);
    NotNull(loss, "loss");
    *loss = EvaluationStep(*s, LoaderBatch(*l, batch_idx), batch_idx, /*test=*/false);
  })
}

}  // extern "C"
