#include "core/checkpoint/safetensors.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <libdeflate.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

namespace fsdp2 {
namespace checkpoint {
namespace {

constexpr const char* kFormatVersion = "1";
constexpr uint64_t kMaxHeaderBytes = 100 << 20;
// Tensor data moves in pieces of this size: each piece is checksummed just
// before it is written out (or just after it is read in) while the disk
// works on the piece before (after) it.
constexpr size_t kChunkBytes = 8 << 20;

const std::vector<std::pair<at::ScalarType, const char*>>& DtypeNames() {
  static const std::vector<std::pair<at::ScalarType, const char*>> names = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"},  {at::kHalf, "F16"},
      {at::kBFloat16, "BF16"}, {at::kLong, "I64"}, {at::kInt, "I32"},
      {at::kShort, "I16"}, {at::kChar, "I8"},     {at::kByte, "U8"},
      {at::kBool, "BOOL"}};
  return names;
}

const char* DtypeName(at::ScalarType t) {
  for (const auto& [type, name] : DtypeNames()) {
    if (type == t) return name;
  }
  throw InvalidArgumentError(std::string("safetensors: unsupported dtype ") +
                              c10::toString(t));
}

[[noreturn]] void Fail(const std::string& path, const std::string& problem) {
  throw IoError(path + ": " + problem);
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

// Writes all of `bytes` to `fd` or fails naming `path`.
void WriteAll(int fd, const char* bytes, size_t size, const std::string& path) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) Fail(path, std::string("write failed: ") + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

// Syncs and closes `fd` (the written file `tmp`), renames `tmp` to `path`
// and syncs the directory, so `path` is either the old file or all of the
// new one. Removes `tmp` on failure.
void PublishFile(int fd, const std::string& tmp, const std::string& path) {
  if (fsync(fd) != 0 || close(fd) != 0) {
    unlink(tmp.c_str());
    Fail(tmp, std::string("fsync failed: ") + std::strerror(errno));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    unlink(tmp.c_str());
    Fail(path, "rename failed: " + why);
  }
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
}

}  // namespace

uint32_t Crc32(const void* data, size_t size, uint32_t crc) {
  // libdeflate's CRC-32 is exactly the one every fsdp2 checkpoint has
  // carried (IEEE 802.3, reflected, inverted before and after; zlib's and
  // gzip's). It picks its code for the CPU it runs on (carry-less multiply
  // where there is one), 15x the byte-at-a-time loop it replaces and 3x
  // zlib's crc32_z on one core here (bench/checkpoint prints the rate).
  return libdeflate_crc32(crc, data, size);
}

void WriteFileAtomically(const std::string& path, const std::string& bytes) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    Fail(path, "is a directory, expected a file");
  }
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Fail(tmp, std::string("cannot create: ") + std::strerror(errno));
  try {
    WriteAll(fd, bytes.data(), bytes.size(), tmp);
  } catch (...) {
    close(fd);
    unlink(tmp.c_str());
    throw;
  }
  PublishFile(fd, tmp, path);
}

void WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsStreamWriter::Spec> specs;
  for (const auto& [name, t] : tensors) {
    specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  SafetensorsStreamWriter writer(path, std::move(specs), metadata);
  for (const auto& item : tensors) writer.write(item.second);
  writer.commit();
}

SafetensorsStreamWriter::SafetensorsStreamWriter(
    std::string path, std::vector<Spec> specs, std::map<std::string, std::string> metadata)
    : path_(std::move(path)), specs_(std::move(specs)), metadata_(std::move(metadata)) {
  struct stat st {};
  if (stat(path_.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    Fail(path_, "is a directory, expected a file");
  }
  std::set<std::string> seen;
  for (const auto& spec : specs_) {
    if (spec.name.empty() || spec.name == "__metadata__" || !seen.insert(spec.name).second) {
      throw InvalidArgumentError("safetensors: bad or repeated tensor name '" + spec.name + "'");
    }
    crcs_[spec.name] = "00000000";  // same width as the real ones
  }
  tmp_ = path_ + ".tmp." + std::to_string(getpid());
  fd_ = open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) Fail(tmp_, std::string("cannot create: ") + std::strerror(errno));
  const std::string h = header(crcs_);
  header_bytes_ = h.size();
  WriteAll(fd_, h.data(), h.size(), tmp_);
  written_ = h.size();
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (fd_ >= 0) {
    close(fd_);
    unlink(tmp_.c_str());
  }
}

std::string SafetensorsStreamWriter::header(
    const std::map<std::string, std::string>& crcs) const {
  nlohmann::json header = nlohmann::json::object();
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [k, v] : metadata_) meta[k] = v;
  meta["fsdp2.format_version"] = kFormatVersion;
  uint64_t offset = 0;
  for (const auto& spec : specs_) {
    uint64_t numel = 1;
    for (int64_t d : spec.shape) numel *= static_cast<uint64_t>(d);
    const uint64_t bytes = numel * c10::elementSize(spec.dtype);
    header[spec.name] = {{"dtype", DtypeName(spec.dtype)},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + bytes}}};
    meta["fsdp2.crc32." + spec.name] = crcs.at(spec.name);
    offset += bytes;
  }
  header["__metadata__"] = meta;
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  return out + json;
}

void SafetensorsStreamWriter::write(const at::Tensor& tensor) {
  if (next_ >= specs_.size()) Fail(path_, "more tensors written than specified");
  const Spec& spec = specs_[next_++];
  at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
  if (t.scalar_type() != spec.dtype || t.sizes().vec() != spec.shape) {
    Fail(path_, "tensor '" + spec.name + "' does not match its declared dtype and shape");
  }
  const size_t bytes = t.numel() * t.element_size();
  const char* data = static_cast<const char*>(t.data_ptr());
  uint32_t crc = 0;
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(kChunkBytes, bytes - done);
    crc = Crc32(data + done, n, crc);
    WriteAll(fd_, data + done, n, tmp_);
    // Start writing this piece back to the disk now rather than at fsync, so
    // that the disk is busy while the next piece is checksummed and copied.
    // Only a hint: where it fails, commit()'s fsync still writes everything.
    sync_file_range(fd_, static_cast<off64_t>(written_), static_cast<off64_t>(n),
                    SYNC_FILE_RANGE_WRITE);
    written_ += n;
    done += n;
  }
  crcs_[spec.name] = Hex(crc);
}

void SafetensorsStreamWriter::commit() {
  if (next_ != specs_.size()) {
    Fail(path_, std::to_string(specs_.size() - next_) + " declared tensors were not written");
  }
  const std::string h = header(crcs_);
  if (h.size() != header_bytes_ || pwrite(fd_, h.data(), h.size(), 0) != static_cast<ssize_t>(h.size())) {
    Fail(tmp_, "could not rewrite the header");
  }
  const int fd = fd_;
  fd_ = -1;  // PublishFile closes it
  PublishFile(fd, tmp_, path_);
}

SafetensorsFile::Identity SafetensorsFile::IdentityOf(int fd) {
  struct stat st {};
  Identity id;
  if (fstat(fd, &st) != 0) return id;
  id.dev = static_cast<uint64_t>(st.st_dev);
  id.ino = static_cast<uint64_t>(st.st_ino);
  id.size = static_cast<uint64_t>(st.st_size);
  id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return id;
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) Fail(path_, "no such file");
  if (S_ISDIR(st.st_mode)) Fail(path_, "is a directory, expected a safetensors file");
  int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail(path_, std::string("cannot open: ") + std::strerror(errno));
  identity_ = IdentityOf(fd);
  const uint64_t size = identity_.size;
  if (size < 8) {
    close(fd);
    Fail(path_, "truncated: " + std::to_string(size) + " bytes, no header");
  }
  unsigned char len[8];
  uint64_t n = 0;
  if (pread(fd, len, 8, 0) != 8) {
    close(fd);
    Fail(path_, "cannot read the header length");
  }
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > kMaxHeaderBytes || n > size - 8) {
    close(fd);
    Fail(path_, "header length " + std::to_string(n) + " does not fit a file of " +
                    std::to_string(size) + " bytes: truncated or not a safetensors file");
  }
  std::string text(n, '\0');
  const bool read_ok = pread(fd, text.data(), n, 8) == static_cast<ssize_t>(n);
  close(fd);
  if (!read_ok) Fail(path_, "cannot read the header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception&) {
    Fail(path_, "the header is not valid JSON: not a safetensors file");
  }
  if (!header.is_object()) Fail(path_, "the header is not a JSON object");
  data_start_ = 8 + n;
  const uint64_t data_size = size - data_start_;
  uint64_t data_end = 0;
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        for (const auto& [k, v] : entry.items()) metadata_[k] = v.get<std::string>();
        continue;
      }
      TensorInfo info;
      const std::string dtype = entry.at("dtype").get<std::string>();
      bool known = false;
      for (const auto& [type, dname] : DtypeNames()) {
        if (dtype == dname) {
          info.dtype = type;
          known = true;
        }
      }
      if (!known) Fail(path_, "tensor '" + name + "' has unsupported dtype " + dtype);
      info.shape = entry.at("shape").get<std::vector<int64_t>>();
      auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2 || offsets[0] > offsets[1]) {
        Fail(path_, "tensor '" + name + "' has invalid data_offsets");
      }
      info.begin = offsets[0];
      info.end = offsets[1];
      uint64_t numel = 1;
      for (int64_t d : info.shape) {
        if (d < 0) Fail(path_, "tensor '" + name + "' has a negative dimension");
        numel *= static_cast<uint64_t>(d);
      }
      if (numel * c10::elementSize(info.dtype) != info.end - info.begin) {
        Fail(path_, "tensor '" + name + "': shape and dtype need " +
                        std::to_string(numel * c10::elementSize(info.dtype)) +
                        " bytes but its range holds " + std::to_string(info.end - info.begin));
      }
      data_end = std::max(data_end, info.end);
      tensors_[name] = info;
    }
  } catch (const nlohmann::json::exception& e) {
    Fail(path_, std::string("malformed header: ") + e.what());
  }
  if (data_end > data_size) {
    Fail(path_, "truncated: the data section needs " + std::to_string(data_end) +
                    " bytes but the file holds " + std::to_string(data_size));
  }
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) Fail(path_, "no tensor named '" + name + "'");
  return it->second;
}

namespace internal {

// Reads byte ranges of one open file, checksumming them as they land. The
// kernel reads ahead of a sequential reader on its own: asking it for more
// (POSIX_FADV_WILLNEED windows) was measured slower, as it fills the page
// cache in the reading thread's own time.
class StreamReader {
 public:
  // Opens `file`, failing where it is no longer the file whose header was
  // read.
  explicit StreamReader(const SafetensorsFile& file) : path_(file.path()) {
    fd_ = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) Fail(path_, std::string("cannot open: ") + std::strerror(errno));
    if (!(SafetensorsFile::IdentityOf(fd_) == file.identity_)) {
      close(fd_);
      Fail(path_, "changed while it was being loaded (replaced or rewritten since its "
                  "header was read)");
    }
    posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  ~StreamReader() { close(fd_); }
  StreamReader(const StreamReader&) = delete;
  StreamReader& operator=(const StreamReader&) = delete;

  // Fills `out` with bytes [offset, offset + bytes) and returns their CRC-32
  // when `checksum`, else 0. With a null `out` the bytes are only
  // checksummed, through one reused buffer.
  uint32_t Read(const std::string& name, uint64_t offset, uint64_t bytes, char* out,
                bool checksum) {
    uint32_t crc = 0;
    if (out == nullptr && scratch_.empty()) scratch_.resize(kChunkBytes);
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t n = std::min<uint64_t>(kChunkBytes, bytes - done);
      const uint64_t at = offset + done;
      char* into = out != nullptr ? out + done : scratch_.data();
      for (uint64_t got_here = 0; got_here < n;) {
        const ssize_t got =
            pread(fd_, into + got_here, n - got_here, static_cast<off_t>(at + got_here));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
          Fail(path_, "cannot read tensor '" + name + "': " + std::strerror(errno));
        }
        if (got == 0) Fail(path_, "short read of tensor '" + name + "': the file is truncated");
        got_here += static_cast<uint64_t>(got);
      }
      if (checksum) crc = Crc32(into, n, crc);
      done += n;
    }
    return crc;
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<char> scratch_;
};

}  // namespace internal

at::Tensor SafetensorsFile::read(internal::StreamReader& reader, const std::string& name,
                                 uint64_t begin, uint64_t bytes, std::vector<int64_t> shape,
                                 bool verify) const {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(info(name).dtype));
  auto crc = metadata_.find("fsdp2.crc32." + name);
  verify = verify && crc != metadata_.end();
  const uint32_t sum =
      reader.Read(name, data_start_ + begin, bytes, static_cast<char*>(t.data_ptr()), verify);
  if (verify && crc->second != Hex(sum)) {
    Fail(path_, "checksum mismatch for tensor '" + name + "': the file is corrupted");
  }
  return t;
}

at::Tensor SafetensorsFile::load(const std::string& name) const {
  const TensorInfo& i = info(name);
  internal::StreamReader reader(*this);
  return read(reader, name, i.begin, i.end - i.begin, i.shape, /*verify=*/true);
}

void SafetensorsFile::load_each(
    const std::function<void(const std::string&, at::Tensor)>& visit,
    const std::function<bool(const std::string&)>& keep) const {
  std::vector<std::pair<uint64_t, std::string>> in_file_order;
  for (const auto& [name, i] : tensors_) in_file_order.emplace_back(i.begin, name);
  std::sort(in_file_order.begin(), in_file_order.end());
  internal::StreamReader reader(*this);
  for (const auto& [begin, name] : in_file_order) {
    const TensorInfo& i = tensors_.at(name);
    if (!keep || keep(name)) {
      visit(name, read(reader, name, i.begin, i.end - i.begin, i.shape, /*verify=*/true));
      continue;
    }
    auto crc = metadata_.find("fsdp2.crc32." + name);
    if (crc == metadata_.end()) continue;  // nothing to check
    const uint32_t sum = reader.Read(name, data_start_ + i.begin, i.end - i.begin,
                                     /*out=*/nullptr, /*checksum=*/true);
    if (crc->second != Hex(sum)) {
      Fail(path_, "checksum mismatch for tensor '" + name + "': the file is corrupted");
    }
  }
}

std::pair<uint64_t, uint64_t> SafetensorsFile::row_range(const std::string& name,
                                                         int64_t row_start,
                                                         int64_t rows) const {
  const TensorInfo& i = info(name);
  if (i.shape.empty()) Fail(path_, "tensor '" + name + "' is 0-d: it has no rows");
  if (row_start < 0 || rows < 0 || row_start + rows > i.shape[0]) {
    Fail(path_, "rows [" + std::to_string(row_start) + ", " +
                    std::to_string(row_start + rows) + ") are outside tensor '" + name +
                    "' of " + std::to_string(i.shape[0]) + " rows");
  }
  const uint64_t row_bytes = i.shape[0] == 0 ? 0 : (i.end - i.begin) / i.shape[0];
  return {i.begin + row_start * row_bytes, rows * row_bytes};
}

at::Tensor SafetensorsFile::load_rows(const std::string& name, int64_t row_start,
                                      int64_t rows) const {
  const auto [begin, bytes] = row_range(name, row_start, rows);
  std::vector<int64_t> shape = info(name).shape;
  shape[0] = rows;
  internal::StreamReader reader(*this);
  return read(reader, name, begin, bytes, shape, /*verify=*/false);
}

void SafetensorsFile::load_rows_into(const std::string& name, int64_t row_start, int64_t rows,
                                     const at::Tensor& out) const {
  const auto [begin, bytes] = row_range(name, row_start, rows);
  if (!out.device().is_cpu() || !out.is_contiguous() || out.scalar_type() != info(name).dtype ||
      static_cast<uint64_t>(out.nbytes()) != bytes) {
    Fail(path_, "rows of tensor '" + name + "' cannot be read into a " +
                    c10::toString(out.scalar_type()) + " tensor of " +
                    std::to_string(out.nbytes()) + " bytes");
  }
  if (bytes == 0) return;
  internal::StreamReader reader(*this);
  reader.Read(name, data_start_ + begin, bytes, static_cast<char*>(out.data_ptr()),
              /*checksum=*/false);
}

void SafetensorsFile::check_unchanged() const { internal::StreamReader reader(*this); }

}  // namespace checkpoint
}  // namespace fsdp2
