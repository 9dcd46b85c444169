#include "hyper_parallel/core/device_mesh.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>

#include "compat/c10d_compat.h"
#include "core/group_description.h"
#include "hyper_parallel/core/distributed.h"

namespace hyper_parallel {

// The random sequence of a mesh, shared by its handles and sub-meshes: one seed for the
// whole mesh, agreed over the root mesh's groups.
struct MeshRandomState {
  std::vector<std::weak_ptr<Communicator>> root_comms;
  c10::Device device = c10::Device(c10::kCPU);
  std::mutex mutex;
  bool seeded = false;
  uint64_t seed = 0;
  uint64_t ops = 0;  // random ops drawn so far
};

struct DeviceMesh::Data {
  std::string device_type;
  c10::Device device = c10::Device(c10::kCPU);
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  std::vector<int64_t> ranks;  // row-major
  int64_t my_rank = 0;
  std::vector<int64_t> coordinate;
  // One per mesh dim. The world owns the groups (as PyTorch's registry does): a mesh, or a
  // layout cached by the dispatcher, does not keep process groups and their threads alive
  // after destroy_process_group().
  std::vector<std::weak_ptr<Communicator>> comms;
  std::shared_ptr<MeshRandomState> random;
  uint64_t uid = next_uid();

  static uint64_t next_uid() {
    static std::atomic<uint64_t> counter{1};
    return counter.fetch_add(1, std::memory_order_relaxed);
  }
};

namespace {
int64_t product(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{1}, std::multiplies<int64_t>());
}

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}
}  // namespace

const DeviceMesh::Data& DeviceMesh::data() const {
  TORCH_CHECK(data_, "use of an undefined DeviceMesh");
  return *data_;
}

const std::string& DeviceMesh::device_type() const { return data().device_type; }
c10::Device DeviceMesh::device() const { return data().device; }
int64_t DeviceMesh::ndim() const { return static_cast<int64_t>(data().shape.size()); }
const std::vector<int64_t>& DeviceMesh::shape() const { return data().shape; }
int64_t DeviceMesh::size(int64_t mesh_dim) const { return data().shape.at(mesh_dim); }
int64_t DeviceMesh::size() const { return static_cast<int64_t>(data().ranks.size()); }
const std::vector<std::string>& DeviceMesh::dim_names() const { return data().names; }
const std::vector<int64_t>& DeviceMesh::ranks() const { return data().ranks; }
int64_t DeviceMesh::get_rank() const { return data().my_rank; }
const std::vector<int64_t>& DeviceMesh::coordinate() const { return data().coordinate; }

const Communicator& DeviceMesh::comm(int64_t mesh_dim) const {
  TORCH_CHECK(mesh_dim >= 0 && mesh_dim < ndim(), "mesh dim ", mesh_dim, " is out of range for a ", ndim(), "-D mesh");
  // The reference stays valid while the world lives; after destroy_process_group() the
  // mesh cannot communicate any more.
  const auto c = data().comms[mesh_dim].lock();
  TORCH_CHECK(c, str(), ": the process group of mesh dim ", mesh_dim,
              " was destroyed "
              "(destroy_process_group()); create a new mesh in the new world");
  return *c;
}

uint64_t DeviceMesh::uid() const { return data_ ? data_->uid : 0; }

int64_t DeviceMesh::mesh_dim_index(const std::string& name) const {
  const auto& names = data().names;
  auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) {
    std::ostringstream os;
    for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << '"' << names[i] << '"';
    TORCH_CHECK_INDEX(false, "mesh has no dimension named \"", name, "\"; its dims are [", os.str(), "]");
  }
  return it - names.begin();
}

DeviceMesh DeviceMesh::operator[](const std::string& name) const { return slice({name}); }

DeviceMesh DeviceMesh::slice(const std::vector<std::string>& names) const {
  const Data& d = data();
  std::vector<int64_t> dims;
  for (const auto& n : names) dims.push_back(mesh_dim_index(n));
  TORCH_CHECK(std::set<int64_t>(dims.begin(), dims.end()).size() == dims.size(), "mesh slice names a dimension twice");
  auto sub = std::make_shared<Data>();
  sub->device_type = d.device_type;
  sub->device = d.device;
  sub->names = names;
  for (int64_t k : dims) {
    sub->shape.push_back(d.shape[k]);
    sub->comms.push_back(d.comms[k]);
    sub->coordinate.push_back(d.coordinate[k]);
  }
  sub->my_rank = d.my_rank;
  sub->random = d.random;
  // Ranks of the sub-mesh: vary the kept dims, fix the others at our coordinate.
  const auto strides = row_major_strides(d.shape);
  const int64_t n = product(sub->shape);
  sub->ranks.resize(n);
  for (int64_t flat = 0; flat < n; ++flat) {
    std::vector<int64_t> coord = d.coordinate;
    int64_t rem = flat;
    for (int64_t j = static_cast<int64_t>(dims.size()) - 1; j >= 0; --j) {
      coord[dims[j]] = rem % sub->shape[j];
      rem /= sub->shape[j];
    }
    int64_t idx = 0;
    for (size_t k = 0; k < coord.size(); ++k) idx += coord[k] * strides[k];
    sub->ranks[flat] = d.ranks[idx];
  }
  return DeviceMesh(std::move(sub));
}

uint64_t DeviceMesh::next_random_seed() const {
  MeshRandomState& r = *data().random;
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.seeded) {
    // Coordinate 0's default seed, broadcast along each dim in turn.
    at::Tensor seed = at::tensor({static_cast<int64_t>(at::detail::getDefaultCPUGenerator().current_seed())},
                                 at::TensorOptions().dtype(at::kLong))
                          .to(r.device);
    for (const auto& c : r.root_comms) {
      const auto comm = c.lock();
      TORCH_CHECK(comm, "next_random_seed: the mesh's process groups were destroyed (destroy_process_group())");
      comm->broadcast_(seed, 0);
    }
    r.seed = static_cast<uint64_t>(seed.cpu().item<int64_t>());
    r.seeded = true;
  }
  // splitmix64 of (seed, op index): independent streams for consecutive ops.
  uint64_t z = r.seed + 0x9e3779b97f4a7c15ull * (++r.ops);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void DeviceMesh::manual_seed(uint64_t seed) const {
  MeshRandomState& r = *data().random;
  std::lock_guard<std::mutex> lock(r.mutex);
  r.seeded = true;
  r.seed = seed;
  r.ops = 0;
}

uint64_t DeviceMesh::random_ops_drawn() const {
  MeshRandomState& r = *data().random;
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.ops;
}

void DeviceMesh::rewind_random_ops(uint64_t ops_drawn) const {
  MeshRandomState& r = *data().random;
  std::lock_guard<std::mutex> lock(r.mutex);
  r.ops = ops_drawn;
}

bool DeviceMesh::operator==(const DeviceMesh& o) const {
  if (data_ == o.data_) return true;
  if (!data_ || !o.data_) return false;
  return data_->device_type == o.data_->device_type && data_->shape == o.data_->shape && data_->ranks == o.data_->ranks;
}

size_t DeviceMesh::hash() const {
  if (!data_) return 0;
  size_t h = std::hash<std::string>()(data_->device_type);
  for (int64_t s : data_->shape) h = h * 1000003u ^ static_cast<size_t>(s);
  for (int64_t r : data_->ranks) h = h * 1000033u ^ static_cast<size_t>(r);
  return h;
}

size_t DeviceMesh::identity_hash() const {
  size_t h = hash();
  for (const auto& c : data().comms) h = h * 1000003u ^ reinterpret_cast<uintptr_t>(c.lock().get());
  for (int64_t c : data().coordinate) h = h * 131u ^ static_cast<size_t>(c);
  return h;
}

std::string DeviceMesh::str() const {
  if (!data_) return "DeviceMesh(undefined)";
  std::ostringstream os;
  os << "DeviceMesh('" << data_->device_type << "', shape=[";
  for (size_t i = 0; i < data_->shape.size(); ++i) os << (i ? ", " : "") << data_->shape[i];
  os << "], dims=[";
  for (size_t i = 0; i < data_->names.size(); ++i) os << (i ? ", " : "") << data_->names[i];
  os << "])";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const DeviceMesh& m) { return os << m.str(); }

DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& dim_names, const MeshOptions& options) {
  if (!is_initialized()) {
    InitOptions init;
    init.device_type = device_type;
    init_process_group(init);
  }
  World& world = current_world();
  TORCH_CHECK(!shape.empty(), "init_device_mesh: expected a non-empty mesh shape");
  for (int64_t s : shape) TORCH_CHECK(s >= 1, "init_device_mesh: mesh sizes must be >= 1, got ", s);
  TORCH_CHECK(product(shape) == world.size, "init_device_mesh: a mesh of shape ", c10::IntArrayRef(shape), " needs ",
              product(shape), " ranks but the world has ", world.size);
  TORCH_CHECK(dim_names.empty() || dim_names.size() == shape.size(), "init_device_mesh: ", shape.size(),
              " mesh dims but ", dim_names.size(), " dim names");
  TORCH_CHECK(world.device_type == device_type || device_type == "cpu", "init_device_mesh: device type '", device_type,
              "' differs from the world's '", world.device_type,
              "'; initialise the world with InitOptions{.device_type = \"", device_type, "\"}");

  auto d = std::make_shared<DeviceMesh::Data>();
  d->device_type = device_type;
  d->device = device_type == world.device_type ? world.device : c10::Device(c10::kCPU);
  d->shape = shape;
  d->names = dim_names;
  if (d->names.empty()) {
    for (size_t i = 0; i < shape.size(); ++i) d->names.push_back("dim" + std::to_string(i));
  }
  TORCH_CHECK(std::set<std::string>(d->names.begin(), d->names.end()).size() == d->names.size(),
              "init_device_mesh: dim names must be unique");
  d->ranks.resize(world.size);
  std::iota(d->ranks.begin(), d->ranks.end(), 0);
  d->my_rank = world.rank;
  const auto strides = row_major_strides(shape);
  int64_t rem = world.rank;
  for (size_t k = 0; k < shape.size(); ++k) {
    d->coordinate.push_back(rem / strides[k]);
    rem %= strides[k];
  }
  const auto timeout = options.timeout.value_or(world.timeout);
  const int64_t mesh_id = world.meshes_created++;
  const std::string backend = options.backend.value_or(
      device_type == world.device_type ? world.backend : compat::default_backend_for(device_type));
  std::string mesh_text = "[";  // "[dp=2, tp=2]", for errors
  for (size_t k = 0; k < shape.size(); ++k) {
    mesh_text += (k ? ", " : "") + d->names[k] + "=" + std::to_string(shape[k]);
  }
  mesh_text += "]";
  for (size_t k = 0; k < shape.size(); ++k) {
    // Members of our group along dim k: our coordinate with coordinate[k] varied.
    std::vector<int64_t> members;
    int64_t base = world.rank - d->coordinate[k] * strides[k];
    for (int64_t i = 0; i < shape[k]; ++i) members.push_back(base + i * strides[k]);
    std::string ns =
        "hp/mesh" + std::to_string(mesh_id) + "/dim" + std::to_string(k) + "/first" + std::to_string(members.front());
    auto store = c10::make_intrusive<c10d::PrefixStore>(ns, world.store);
    auto pg = compat::make_process_group(backend, store, static_cast<int>(d->coordinate[k]), static_cast<int>(shape[k]),
                                         timeout);
    auto comm = std::make_shared<Communicator>(std::move(pg), std::move(members));
    describe_group(*comm, "mesh dim '" + d->names[k] + "' of mesh " + mesh_text, timeout);
    world.groups.push_back(comm);
    d->comms.push_back(comm);
  }
  d->random = std::make_shared<MeshRandomState>();
  d->random->root_comms = d->comms;
  d->random->device = d->device;
  return DeviceMesh(std::move(d));
}

}  // namespace hyper_parallel
