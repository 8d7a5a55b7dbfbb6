#include "core/strategy/token_dataset.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

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

// The file's size in bytes, from an open descriptor that closes with it.
class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) {
      const std::string message = "cannot open token file " + path + ": " + std::strerror(errno);
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
  if (!(o.begin_fraction >= 0 && o.begin_fraction < o.end_fraction && o.end_fraction <= 1)) {
    throw InvalidArgumentError("need 0 <= begin_fraction < end_fraction <= 1");
  }
  ReadOnlyFile file(path);
  struct stat st;
  if (::fstat(file.fd(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw IoError("token file " + path + " is not a regular file");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  const size_t item = static_cast<size_t>(TokenSize(o.token_type));
  if (bytes % item != 0) {
    throw IoError("token file " + path + " has " + std::to_string(bytes) +
                  " bytes, not a multiple of the token size " + std::to_string(item));
  }
  const int64_t tokens = static_cast<int64_t>(bytes / item);
  const int64_t window = o.block_size + 1;
  const int64_t all_rows = tokens / window;
  const int64_t first = static_cast<int64_t>(std::floor(o.begin_fraction * all_rows));
  const int64_t last = static_cast<int64_t>(std::floor(o.end_fraction * all_rows));
  if (bytes == 0 || last <= first) {
    return at::empty({0, window}, at::TensorOptions().dtype(ScalarTypeOf(o.token_type)));
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (map == MAP_FAILED) throw IoError("cannot map token file " + path);
  at::Tensor all = at::from_blob(
      map, {tokens}, [bytes](void* p) { ::munmap(p, bytes); },
      at::TensorOptions().dtype(ScalarTypeOf(o.token_type)));
  return all.narrow(0, 0, all_rows * window).view({all_rows, window}).narrow(0, first, last - first);
}

TokenLoader::TokenLoader(DataLoader windows, TokenType token_type, int64_t block_size)
    : windows_(std::move(windows)), token_type_(token_type), block_size_(block_size) {}

Batch TokenLoader::batch(int64_t index) const {
  if (index < 0 || index >= num_batches()) {
    throw InvalidArgumentError("batch_idx " + std::to_string(index) +
                               " is outside the loader's " + std::to_string(num_batches()) +
                               " batches");
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
