// fsdp2/core/comm/device_mesh.h
//
// DeviceMesh: the world's ranks arranged as an N-D grid with named dimensions
// (e.g. {"dp"}, {"replicate", "shard"} or {"dp", "tp"}), with one process
// group per dimension: the ranks that differ from this one only along it.
// Ranks are laid out row-major: in a {R, S} mesh, rank = r * S + s.
//
// Creation is collective: every rank creates the same meshes in the same order.
#ifndef FSDP2_CORE_COMM_DEVICE_MESH_H_
#define FSDP2_CORE_COMM_DEVICE_MESH_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/process_group.h"
#include "core/comm/world.h"

namespace fsdp2 {
namespace comm {

// An N-D grid of the world's ranks with one process group per named
// dimension (see above). Immutable once made, but for block_group's cache;
// shared by pointer.
class DeviceMesh {
 public:
  // Throws std::invalid_argument if the sizes are not positive, their product
  // is not the world size, or names are missing, empty or repeated.
  static std::shared_ptr<DeviceMesh> Create(std::shared_ptr<World> world,
                                            std::vector<int> shape,
                                            std::vector<std::string> dim_names);

  // The number of dimensions (the length of shape()).
  int ndim() const { return static_cast<int>(shape_.size()); }
  // The ranks along each dimension, outermost first, as given to Create.
  const std::vector<int>& shape() const { return shape_; }
  // The dimensions' names, in shape()'s order.
  const std::vector<std::string>& dim_names() const { return names_; }
  // Whether a dimension is named `name` (never throws).
  bool has_dim(const std::string& name) const;
  // The ranks along `dim`; throws InvalidArgumentError for an unknown name.
  int size(const std::string& dim) const;
  int size() const;  // all ranks of the mesh
  // This rank's coordinate along `dim`.
  int local_rank(const std::string& dim) const;
  // The group of ranks that share this rank's coordinates on every other dim.
  const std::shared_ptr<ProcessGroup>& group(const std::string& dim) const;
  // The group of this rank's `size` consecutive neighbours along `dim`:
  // every group of group(dim)'s kind cut into blocks of `size` ranks (with
  // ranks numbered host by host, the ranks of one host). Made on the first
  // call for (dim, size), collectively: every rank asks for the same ones
  // in the same order; cached after that. Throws std::invalid_argument
  // unless `size` is positive and divides size(dim).
  std::shared_ptr<ProcessGroup> block_group(const std::string& dim, int size);
  // The world the mesh arranges (every rank of the job).
  const std::shared_ptr<World>& world() const { return world_; }
  std::string ToString() const;  // e.g. "DeviceMesh(replicate=2, shard=2)"

 private:
  DeviceMesh() = default;
  int dim_index(const std::string& name) const;

  std::shared_ptr<World> world_;
  std::vector<int> shape_;
  std::vector<std::string> names_;
  std::vector<int> coords_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;
  std::map<std::pair<int, int>, std::shared_ptr<ProcessGroup>> block_groups_;
};

}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_DEVICE_MESH_H_
