#include "core/strategy/token_dataset.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "core/common/error.h"

namespace fsdp2 {
namespace strategy {
namespace {

at::ScalarType ScalarTypeOf(TokenType type) {
  switch (type) {
    case TokenType::kUInt8: return at::kByte;
    case TokenType::kUInt16: return at::kShort;  // the bits; widened on read
    case TokenType::kInt32: return at::kInt;
  }
  throw InvalidArgumentError("unknown token type");
}

// An open descriptor that closes with it; `what` names the file in errors
// ("token file").
class ReadOnlyFile {
 public:
  ReadOnlyFile(const std::string& path, const std::string& what)
      : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) {
      const std::string message = "cannot open " + what + " " + path + ": " + std::strerror(errno);
      if (errno == ENOENT) throw NotFoundError(message);
      throw IoError(message);
    }
  }
  ~ReadOnlyFile() { ::close(fd_); }
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

// The whole file at `path` as bytes [size], over a private read-only
// mapping that lives as long as any tensor viewing it (an empty tensor for
// an empty file). Throws NotFoundError / IoError naming `what` and path.
at::Tensor MapBytes(const std::string& path, const std::string& what) {
  ReadOnlyFile file(path, what);
  struct stat st;
  if (::fstat(file.fd(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw IoError(what + " " + path + " is not a regular file");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes == 0) return at::empty({0}, at::kByte);
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (map == MAP_FAILED) throw IoError("cannot map " + what + " " + path);
  return at::from_blob(
      map, {static_cast<int64_t>(bytes)}, [bytes](void* p) { ::munmap(p, bytes); },
      at::TensorOptions().dtype(at::kByte));
}

void CheckFractions(double begin, double end) {
  if (!(begin >= 0 && begin < end && end <= 1)) {
    throw InvalidArgumentError("need 0 <= begin_fraction < end_fraction <= 1");
  }
}

// [first, last) of `rows` for the fractions.
std::pair<int64_t, int64_t> FractionRows(int64_t rows, double begin, double end) {
  CheckFractions(begin, end);
  return {static_cast<int64_t>(std::floor(begin * rows)),
          static_cast<int64_t>(std::floor(end * rows))};
}

}  // namespace

int64_t TokenSize(TokenType type) {
  switch (type) {
    case TokenType::kUInt8: return 1;
    case TokenType::kUInt16: return 2;
    case TokenType::kInt32: return 4;
  }
  throw InvalidArgumentError("unknown token type");
}

at::Tensor MapTokenWindows(const std::string& path, const TokenDatasetOptions& o) {
  if (o.block_size < 1) throw InvalidArgumentError("block_size must be positive");
  CheckFractions(o.begin_fraction, o.end_fraction);  // before the file is opened
  const at::Tensor bytes = MapBytes(path, "token file");
  const int64_t item = TokenSize(o.token_type);
  if (bytes.numel() % item != 0) {
    throw IoError("token file " + path + " has " + std::to_string(bytes.numel()) +
                  " bytes, not a multiple of the token size " + std::to_string(item));
  }
  const at::Tensor all = bytes.view(ScalarTypeOf(o.token_type));
  const int64_t window = o.block_size + 1;
  const int64_t all_rows = all.numel() / window;
  const auto [first, last] = FractionRows(all_rows, o.begin_fraction, o.end_fraction);
  return all.narrow(0, 0, all_rows * window)
      .view({all_rows, window})
      .narrow(0, first, std::max<int64_t>(last - first, 0));
}

namespace {

// `path`'s `count` int32 values, mapped read-only (IoError naming it when
// its size differs).
at::Tensor MapInt32(const std::string& path, int64_t count) {
  const at::Tensor bytes = MapBytes(path, "prepared dataset file");
  if (bytes.numel() != count * 4) {
    throw IoError("prepared dataset file " + path + " has " + std::to_string(bytes.numel()) +
                  " bytes; meta.json's rows x seq_len int32 values are " +
                  std::to_string(count * 4) + " (an interrupted or mixed preparation?)");
  }
  return bytes.view(at::kInt);
}

}  // namespace

bool IsPreparedDataset(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) &&
         std::filesystem::is_regular_file(std::filesystem::path(path) / "meta.json", ec);
}

PreparedDataset MapPreparedDataset(const std::string& dir, double begin_fraction,
                                   double end_fraction) {
  const std::string meta_path = (std::filesystem::path(dir) / "meta.json").string();
  std::ifstream in(meta_path);
  if (!in) throw NotFoundError("prepared dataset " + dir + ": no meta.json");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(meta_path + " is not JSON: " + e.what());
  }
  const auto field = [&](const char* key) -> const nlohmann::json& {
    if (!meta.is_object() || !meta.contains(key)) {
      throw IoError(meta_path + " has no \"" + std::string(key) +
                    "\" (not a dataset written by fsdp2.prepare_data)");
    }
    return meta[key];
  };
  if (field("format") != "fsdp2-sft" || field("version") != 1 || field("dtype") != "int32" ||
      field("byte_order") != "little") {
    throw IoError(meta_path + ": format " + field("format").dump() + " version " +
                  field("version").dump() +
                  " is not fsdp2.prepare_data's \"fsdp2-sft\" version 1 (int32, little-endian)");
  }
  const nlohmann::json& seq = field("seq_len");
  const nlohmann::json& rows_field = field("rows");
  if (!seq.is_number_integer() || seq.get<int64_t>() < 1 || !rows_field.is_number_integer() ||
      rows_field.get<int64_t>() < 0) {
    throw IoError(meta_path + ": seq_len and rows must be a positive and a non-negative integer");
  }
  const int64_t T = seq.get<int64_t>(), rows = rows_field.get<int64_t>();
  const nlohmann::json& files = field("files");
  const auto [first, last] = FractionRows(rows, begin_fraction, end_fraction);
  PreparedDataset out;
  out.seq_len = T;
  for (auto [key, target] : {std::pair<const char*, at::Tensor*>{"tokens", &out.tokens},
                            {"labels", &out.labels},
                            {"segments", &out.segments}}) {
    if (!files.is_object() || !files.contains(key) || !files[key].is_string()) {
      throw IoError(meta_path + ": \"files\" must name the \"" + std::string(key) + "\" file");
    }
    const std::string path = (std::filesystem::path(dir) / files[key].get<std::string>()).string();
    *target = MapInt32(path, rows * T).view({rows, T}).narrow(0, first, last - first);
  }
  return out;
}

TokenLoader::TokenLoader(DataLoader windows, TokenType token_type, int64_t block_size)
    : windows_(std::move(windows)), token_type_(token_type), block_size_(block_size) {}

TokenLoader TokenLoader::Prepared(DataLoader rows, int64_t seq_len) {
  TokenLoader loader(std::move(rows), TokenType::kInt32, seq_len);
  loader.prepared_ = true;
  return loader;
}

Batch TokenLoader::batch(int64_t index) const {
  if (index < 0 || index >= num_batches()) {
    throw InvalidArgumentError("batch_idx " + std::to_string(index) +
                               " is outside the loader's " + std::to_string(num_batches()) +
                               " batches");
  }
  if (prepared_) {
    Batch rows = windows_.batch(index);
    for (at::Tensor& t : rows) t = t.to(at::kLong);
    return rows;
  }
  at::Tensor windows = windows_.batch(index)[0].to(at::kLong);
  if (token_type_ == TokenType::kUInt16) windows = windows.bitwise_and(0xFFFF);
  return {windows.narrow(1, 0, block_size_), windows.narrow(1, 1, block_size_)};
}

TokenLoader MakeTokenLoader(const FSDP2Strategy& strategy, const std::string& path,
                            const TokenDatasetOptions& options, int64_t global_batch_size) {
  if (global_batch_size < 1) throw InvalidArgumentError("global_batch_size must be positive");
  if (!strategy.world()) {
    throw FailedPreconditionError("MakeTokenLoader: call setup_environment() first");
  }
  if (IsPreparedDataset(path)) {
    const PreparedDataset data =
        MapPreparedDataset(path, options.begin_fraction, options.end_fraction);
    if (data.tokens.size(0) < global_batch_size) {
      throw InvalidArgumentError("prepared dataset " + path + " holds " +
                                 std::to_string(data.tokens.size(0)) +
                                 " rows in the chosen fraction, fewer than one global batch of " +
                                 std::to_string(global_batch_size));
    }
    return TokenLoader::Prepared(
        strategy.process_dataloader({data.tokens, data.labels, data.segments}, global_batch_size),
        data.seq_len);
  }
  at::Tensor windows = MapTokenWindows(path, options);
  if (windows.size(0) < global_batch_size) {
    throw InvalidArgumentError(
        "token file " + path + " holds " + std::to_string(windows.size(0)) +
        " windows of block_size + 1 = " + std::to_string(options.block_size + 1) +
        " tokens in the chosen fraction, fewer than one global batch of " +
        std::to_string(global_batch_size));
  }
  return TokenLoader(strategy.process_dataloader({windows}, global_batch_size),
                     options.token_type, options.block_size);
}

}  // namespace strategy
}  // namespace fsdp2
