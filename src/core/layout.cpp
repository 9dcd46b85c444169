#include "hyper_parallel/core/layout.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace hyper_parallel {

std::vector<int64_t> contiguous_strides(c10::IntArrayRef shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) {
    s[i] = s[i + 1] * std::max<int64_t>(shape[i + 1], 1);
  }
  return s;
}

Layout::Layout(DeviceMesh mesh, Placements placements, std::vector<int64_t> shape, std::vector<int64_t> stride) {
  TORCH_CHECK(mesh.defined(), "Layout needs a defined DeviceMesh");
  TORCH_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), "expected ", mesh.ndim(),
              " placements (one per mesh dim of ", mesh.str(), "), got ", placements.size(), ": ",
              to_string(placements));
  auto d = std::make_shared<Data>();
  const int64_t ndim = static_cast<int64_t>(shape.size());
  for (auto& p : placements) d->placements.push_back(p.normalized(ndim));
  if (stride.empty()) stride = contiguous_strides(shape);
  TORCH_CHECK(stride.size() == shape.size(), "Layout: stride has ", stride.size(), " entries for a shape of ",
              shape.size());
  d->mesh = std::move(mesh);
  d->shape = std::move(shape);
  d->stride = std::move(stride);
  size_t h = d->mesh.hash();
  for (auto& p : d->placements) h = h * 31 + p.hash();
  for (int64_t s : d->shape) h = h * 1000003u ^ static_cast<size_t>(s);
  for (int64_t s : d->stride) h = h * 131u ^ static_cast<size_t>(s);
  d->hash = h;
  data_ = d;
  local_piece_at(d->mesh.coordinate(), &d->local_shape, &d->local_offset);
}

void Layout::local_piece_at(const std::vector<int64_t>& coordinate, std::vector<int64_t>* shape,
                            std::vector<int64_t>* offset) const {
  *shape = data_->shape;
  offset->assign(shape->size(), 0);
  for (size_t m = 0; m < data_->placements.size(); ++m) {
    const Placement& p = data_->placements[m];
    if (!p.is_shard()) continue;
    const int64_t d = p.dim();
    ChunkRange r = chunk_range((*shape)[d], data_->mesh.size(m), coordinate[m]);
    (*shape)[d] = r.length;
    (*offset)[d] += r.offset;
  }
}

bool Layout::is_replicated() const {
  for (auto& p : placements())
    if (!p.is_replicate()) return false;
  return true;
}

bool Layout::has_partial() const {
  for (auto& p : placements())
    if (p.is_partial()) return true;
  return false;
}

std::vector<int64_t> Layout::mesh_dims_sharding(int64_t dim) const {
  std::vector<int64_t> out;
  for (size_t m = 0; m < placements().size(); ++m) {
    if (placements()[m].is_shard(dim)) out.push_back(static_cast<int64_t>(m));
  }
  return out;
}

bool Layout::has_nested_shards() const {
  for (int64_t d = 0; d < ndim(); ++d)
    if (mesh_dims_sharding(d).size() > 1) return true;
  return false;
}

Layout Layout::with_placements(Placements placements) const {
  return Layout(mesh(), std::move(placements), shape(), stride());
}

bool Layout::operator==(const Layout& o) const {
  if (data_ == o.data_) return true;
  if (!data_ || !o.data_) return false;
  return data_->hash == o.data_->hash && data_->placements == o.data_->placements && data_->shape == o.data_->shape &&
         data_->stride == o.data_->stride && data_->mesh == o.data_->mesh;
}

std::string Layout::str() const {
  if (!data_) return "Layout(undefined)";
  std::ostringstream os;
  os << "Layout(" << to_string(placements()) << ", shape=" << c10::IntArrayRef(shape()) << ", mesh=" << mesh().str()
     << ")";
  return os.str();
}

}  // namespace hyper_parallel
