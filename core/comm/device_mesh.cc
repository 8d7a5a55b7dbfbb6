#include "core/comm/device_mesh.h"
#include "core/common/error.h"

#include <set>
#include <sstream>
#include <stdexcept>

namespace fsdp2 {
namespace comm {

std::shared_ptr<DeviceMesh> DeviceMesh::Create(
    std::shared_ptr<World> world, std::vector<int> shape,
    std::vector<std::string> dim_names) {
  if (!world) throw InvalidArgumentError("DeviceMesh: world is null");
  if (shape.empty() || shape.size() != dim_names.size()) {
    throw InvalidArgumentError(
        "DeviceMesh: need one name per dimension and at least one dimension");
  }
  int64_t product = 1;
  std::set<std::string> seen;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 1) {
      throw InvalidArgumentError("DeviceMesh: dimension '" + dim_names[d] +
                                  "' has size " + std::to_string(shape[d]) +
                                  "; sizes must be positive");
    }
    if (dim_names[d].empty() || !seen.insert(dim_names[d]).second) {
      throw InvalidArgumentError(
          "DeviceMesh: dimension names must be non-empty and distinct");
    }
    product *= shape[d];
  }
  auto mesh = std::shared_ptr<DeviceMesh>(new DeviceMesh());
  mesh->world_ = world;
  mesh->shape_ = shape;
  mesh->names_ = dim_names;
  if (product != world->size()) {
    throw InvalidArgumentError("DeviceMesh: " + mesh->ToString() + " has " +
                                std::to_string(product) +
                                " ranks but the world has " +
                                std::to_string(world->size()));
  }
  // Row-major coordinates of this rank.
  const int nd = static_cast<int>(shape.size());
  std::vector<int> strides(nd, 1);
  for (int d = nd - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
  mesh->coords_.resize(nd);
  for (int d = 0; d < nd; ++d) {
    mesh->coords_[d] = (world->rank() / strides[d]) % shape[d];
  }
  // For each dim: partition the ranks into lines along that dim.
  for (int d = 0; d < nd; ++d) {
    std::vector<std::vector<int>> lines;
    for (int r = 0; r < world->size(); ++r) {
      if ((r / strides[d]) % shape[d] != 0) continue;  // r starts a line
      std::vector<int> line;
      for (int k = 0; k < shape[d]; ++k) line.push_back(r + k * strides[d]);
      lines.push_back(std::move(line));
    }
    mesh->groups_.push_back(world->new_groups(lines, dim_names[d]));
  }
  return mesh;
}

int DeviceMesh::dim_index(const std::string& name) const {
  for (size_t d = 0; d < names_.size(); ++d) {
    if (names_[d] == name) return static_cast<int>(d);
  }
  throw InvalidArgumentError("DeviceMesh: no dimension named '" + name +
                              "' in " + ToString());
}

bool DeviceMesh::has_dim(const std::string& name) const {
  for (const auto& n : names_) {
    if (n == name) return true;
  }
  return false;
}

int DeviceMesh::size(const std::string& dim) const {
  return shape_[dim_index(dim)];
}

int DeviceMesh::size() const {
  int n = 1;
  for (int s : shape_) n *= s;
  return n;
}

int DeviceMesh::local_rank(const std::string& dim) const {
  return coords_[dim_index(dim)];
}

const std::shared_ptr<ProcessGroup>& DeviceMesh::group(
    const std::string& dim) const {
  return groups_[dim_index(dim)];
}

std::shared_ptr<ProcessGroup> DeviceMesh::block_group(const std::string& dim,
                                                      int size) {
  const int d = dim_index(dim);
  if (size < 1 || shape_[d] % size != 0) {
    throw InvalidArgumentError("DeviceMesh: blocks of " + std::to_string(size) +
                               " ranks do not divide dimension '" + dim + "' of " +
                               ToString());
  }
  auto cached = block_groups_.find({d, size});
  if (cached != block_groups_.end()) return cached->second;
  int stride = 1;
  for (size_t e = d + 1; e < shape_.size(); ++e) stride *= shape_[e];
  std::vector<std::vector<int>> blocks;
  for (int r = 0; r < world_->size(); ++r) {
    if ((r / stride) % shape_[d] != 0) continue;  // r starts a line along d
    for (int b = 0; b < shape_[d]; b += size) {
      std::vector<int> block;
      for (int k = b; k < b + size; ++k) block.push_back(r + k * stride);
      blocks.push_back(std::move(block));
    }
  }
  auto group = world_->new_groups(blocks, dim + "/" + std::to_string(size));
  block_groups_[{d, size}] = group;
  return group;
}

std::string DeviceMesh::ToString() const {
  std::ostringstream s;
  s << "DeviceMesh(";
  for (size_t d = 0; d < shape_.size(); ++d) {
    s << (d ? ", " : "") << names_[d] << "=" << shape_[d];
  }
  s << ")";
  return s.str();
}

}  // namespace comm
}  // namespace fsdp2
