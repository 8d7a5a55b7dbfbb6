#include "core/checkpoint/safetensors.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
  static uint32_t table[256] = {0};
  static const bool ready = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    return true;
  }();
  (void)ready;
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
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
  crcs_[spec.name] = Hex(Crc32(t.data_ptr(), bytes));
  WriteAll(fd_, static_cast<const char*>(t.data_ptr()), bytes, tmp_);
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

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) Fail(path_, "no such file");
  if (S_ISDIR(st.st_mode)) Fail(path_, "is a directory, expected a safetensors file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) Fail(path_, "truncated: " + std::to_string(size) + " bytes, no header");
  int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail(path_, std::string("cannot open: ") + std::strerror(errno));
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

at::Tensor SafetensorsFile::read(const std::string& name, uint64_t begin,
                                 uint64_t bytes, std::vector<int64_t> shape) const {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(info(name).dtype));
  int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail(path_, std::string("cannot open: ") + std::strerror(errno));
  uint64_t done = 0;
  auto* out = static_cast<char*>(t.data_ptr());
  while (done < bytes) {
    ssize_t got = pread(fd, out + done, bytes - done, data_start_ + begin + done);
    if (got <= 0) {
      close(fd);
      Fail(path_, "short read of tensor '" + name + "': the file is truncated");
    }
    done += static_cast<uint64_t>(got);
  }
  close(fd);
  return t;
}

at::Tensor SafetensorsFile::load(const std::string& name) const {
  const TensorInfo& i = info(name);
  at::Tensor t = read(name, i.begin, i.end - i.begin, i.shape);
  auto crc = metadata_.find("fsdp2.crc32." + name);
  if (crc != metadata_.end() && crc->second != Hex(Crc32(t.data_ptr(), i.end - i.begin))) {
    Fail(path_, "checksum mismatch for tensor '" + name + "': the file is corrupted");
  }
  return t;
}

at::Tensor SafetensorsFile::load_rows(const std::string& name, int64_t row_start,
                                      int64_t rows) const {
  const TensorInfo& i = info(name);
  if (i.shape.empty()) Fail(path_, "tensor '" + name + "' is 0-d: it has no rows");
  if (row_start < 0 || rows < 0 || row_start + rows > i.shape[0]) {
    Fail(path_, "rows [" + std::to_string(row_start) + ", " +
                    std::to_string(row_start + rows) + ") are outside tensor '" + name +
                    "' of " + std::to_string(i.shape[0]) + " rows");
  }
  const uint64_t row_bytes = i.shape[0] == 0 ? 0 : (i.end - i.begin) / i.shape[0];
  std::vector<int64_t> shape = i.shape;
  shape[0] = rows;
  return read(name, i.begin + row_start * row_bytes, rows * row_bytes, shape);
}

}  // namespace checkpoint
}  // namespace fsdp2
