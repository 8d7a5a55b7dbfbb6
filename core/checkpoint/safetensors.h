// fsdp2/core/checkpoint/safetensors.h
//
// Reading and writing safetensors files: an 8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range, then
// the raw little-endian data. Other tools (Python's safetensors, numpy with a
// few lines) read these files.
//
// fsdp2 adds, inside the standard "__metadata__" map: "fsdp2.format_version"
// and one "fsdp2.crc32.<name>" per tensor, so corruption is detected on load.
//
// Writes are atomic: the file is written beside its final name, fsync'ed and
// renamed, so a crash mid-write leaves any previous file intact. Every error
// is a std::runtime_error naming the file and the problem.
#ifndef FSDP2_CORE_CHECKPOINT_SAFETENSORS_H_
#define FSDP2_CORE_CHECKPOINT_SAFETENSORS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fsdp2 {
namespace checkpoint {
namespace internal {
class StreamReader;  // safetensors.cc
}  // namespace internal

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes `tensors` (CPU or not; copied to CPU, contiguous) and `metadata`.
// Names must be unique and non-empty.
void WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Writes a safetensors file one tensor at a time, for files larger than
// memory: names, dtypes and shapes are given up front, write() takes each
// tensor's data in that order, and commit() fills in the checksums and moves
// the file into place atomically. Without commit() nothing is left behind.
class SafetensorsStreamWriter {
 public:
  struct Spec {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsStreamWriter(std::string path, std::vector<Spec> specs,
                          std::map<std::string, std::string> metadata = {});
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  void write(const at::Tensor& tensor);  // the next tensor, as specified
  void commit();

 private:
  std::string header(const std::map<std::string, std::string>& crcs) const;

  std::string path_, tmp_;
  std::vector<Spec> specs_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, std::string> crcs_;
  size_t next_ = 0;
  size_t header_bytes_ = 0;
  uint64_t written_ = 0;  // bytes in the file so far
  int fd_ = -1;
};

struct TensorInfo {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range within the data section
  uint64_t end = 0;
};

// An open safetensors file: its header is read and checked at once (sizes,
// ranges, dtypes, file length); tensor data is read on demand.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;

  // The whole tensor, checksum verified when the file carries one.
  at::Tensor load(const std::string& name) const;
  // Every tensor's checksum verified, in the order of the file, in one
  // sequential pass: the fastest way to check a whole file. The tensors
  // `keep` accepts (all, without it) go to `visit`; the others are only
  // checked, through one small buffer, so that checking costs no memory.
  // Stops at the first error (thrown).
  void load_each(const std::function<void(const std::string&, at::Tensor)>& visit,
                 const std::function<bool(const std::string&)>& keep = nullptr) const;
  // Rows [row_start, row_start + rows) along dim 0, reading only their bytes
  // (no checksum: it covers the whole tensor).
  at::Tensor load_rows(const std::string& name, int64_t row_start,
                       int64_t rows) const;
  // The same rows read straight into `out`: contiguous CPU memory of the
  // tensor's dtype holding exactly those rows.
  void load_rows_into(const std::string& name, int64_t row_start, int64_t rows,
                      const at::Tensor& out) const;
  // Fails (naming the file) where the file on disk is no longer the one
  // whose header was read: replaced, rewritten or truncated since.
  void check_unchanged() const;

 private:
  // Which file this is (device, inode, size, modification time): every read
  // checks that it reads the file whose header it parsed.
  struct Identity {
    uint64_t dev = 0, ino = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const Identity& o) const {
      return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
    }
  };
  friend class internal::StreamReader;
  static Identity IdentityOf(int fd);

  // Reads bytes [begin, begin + bytes) of the data section as a tensor of
  // `name`'s dtype; with `verify`, checks the tensor's CRC-32 (where the
  // file has one) as the bytes come in.
  at::Tensor read(internal::StreamReader& reader, const std::string& name, uint64_t begin,
                  uint64_t bytes, std::vector<int64_t> shape, bool verify) const;
  // Byte range of rows [row_start, row_start + rows) of `name`, checked.
  std::pair<uint64_t, uint64_t> row_range(const std::string& name, int64_t row_start,
                                          int64_t rows) const;

  std::string path_;
  Identity identity_;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// CRC-32 (IEEE 802.3, as zlib's and gzip's) of a byte range, for checksums in metadata;
// `crc` continues an earlier range's value: Crc32(b, m, Crc32(a, n)) is the
// CRC of a followed by b.
uint32_t Crc32(const void* data, size_t size, uint32_t crc = 0);

// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync of
// the directory).
void WriteFileAtomically(const std::string& path, const std::string& bytes);

}  // namespace checkpoint
}  // namespace fsdp2

#endif  // FSDP2_CORE_CHECKPOINT_SAFETENSORS_H_
