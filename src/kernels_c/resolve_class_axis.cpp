// hpk_resolve_class_axis and hpk_class_axis_mean (include/hyper_parallel_kernels/loss_kernels.h):
// the one class-axis decision (src/loss/class_axis.h) for callers without C++: the Python front
// ends, through ctypes.
#include <algorithm>
#include <cstring>

#include "hyper_parallel_kernels/loss_kernels.h"
#include "kernels_c/kernel_error.h"
#include "loss/class_axis.h"

namespace hyper_parallel::kernels_c {

namespace {

namespace ca = class_axis;

std::string text(const char* s) { return s ? s : ""; }

ca::Placement placement_of(const hpk_placement& p, int64_t mesh_dim, int64_t ndim) {
  switch (p.kind) {
    case HPK_PLACEMENT_SHARD:
      if (p.dim < 0 || p.dim >= ndim)
        fail(HPK_ERROR_SHAPE, "placements[", mesh_dim, "]: expected a Shard of a dim in [0, ", ndim, "), got ", p.dim);
      return ca::shard(p.dim);
    case HPK_PLACEMENT_REPLICATE:
      return ca::replicate();
    case HPK_PLACEMENT_PARTIAL:
      return {ca::Kind::Partial, -1};
    case HPK_PLACEMENT_OTHER:
      return {ca::Kind::Other, -1};
  }
  fail(HPK_ERROR_OPTION, "placements[", mesh_dim, "].kind: expected an hpk_placement_kind (0 to 3), got ", p.kind);
}

ca::Question question_of(const hpk_class_axis_query& q) {
  if (q.ndim < 1 || q.class_dim < 0 || q.class_dim >= q.ndim)
    fail(HPK_ERROR_SHAPE, "expected class_dim in [0, ndim) and ndim >= 1, got class_dim ", q.class_dim, ", ndim ",
         q.ndim);
  if (q.strictness < HPK_STRICTNESS_UNKNOWN || q.strictness > HPK_STRICTNESS_STRICT)
    fail(HPK_ERROR_OPTION, "strictness: expected -1, 0 or 1, got ", q.strictness);
  ca::Question out;
  out.is_dtensor = q.is_dtensor != 0;
  out.class_dim = q.class_dim;
  out.route = {q.can_relayout != 0, q.rows_sharded != 0, text(q.tensor), text(q.relax)};
  out.strictness = static_cast<ca::Strictness>(q.strictness);
  out.op = text(q.op);
  out.found = text(q.found);
  out.options_mesh = text(q.options_mesh);
  if (!out.is_dtensor) return out;
  if (q.mesh_ndim < 1 || q.mesh_ndim > HPK_MAX_MESH_DIMS)
    fail(HPK_ERROR_SHAPE, "mesh_ndim: expected 1 to ", static_cast<int>(HPK_MAX_MESH_DIMS), ", got ", q.mesh_ndim);
  for (int64_t d = 0; d < q.mesh_ndim; ++d) {
    out.placements.push_back(placement_of(q.placements[d], d, q.ndim));
    if (q.has_options_mesh) out.options_mesh_fits.push_back(q.options_mesh_fits[d] != 0);
  }
  return out;
}

// The whole `text` into the caller's buffer, truncated to fit; returns its length.
int64_t copy_out(const std::string& text, char* buffer, int64_t capacity) {
  if (buffer && capacity > 0) {
    const size_t n = std::min<size_t>(text.size(), static_cast<size_t>(capacity - 1));
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return static_cast<int64_t>(text.size());
}

hpk_placement ours(const ca::Placement& p) {
  return {p.is_shard() ? HPK_PLACEMENT_SHARD : HPK_PLACEMENT_REPLICATE, p.is_shard() ? p.dim : -1};
}

}  // namespace

}  // namespace hyper_parallel::kernels_c

using namespace hyper_parallel::kernels_c;

namespace {

// Asks `decide` the query's question and answers in the C terms: the outcome into `axis` (and
// the resolution, where `resolution`), a refusal's message into its buffer and `error`.
template <class Decide>
int32_t answer(const char* name, const hpk_class_axis_query* query, hpk_class_axis* axis, hpk_error* error,
               Decide decide, bool resolution) {
  ca::Decision decision;
  const int32_t status = run_guarded(name, error, [&] {
    if (!query || !axis) fail(HPK_ERROR_NULL_POINTER, "expected a query and an answer, got NULL");
    decision = decide(question_of(*query));
  });
  if (status != HPK_OK) return status;
  axis->message_length = copy_out(decision.message, axis->message, axis->message_capacity);
  switch (decision.outcome) {
    case ca::Outcome::LayoutError:
      return report(error, HPK_ERROR_LAYOUT, nullptr, decision.message.c_str());
    case ca::Outcome::UnsupportedError:
      return report(error, HPK_ERROR_UNSUPPORTED, nullptr, decision.message.c_str());
    case ca::Outcome::NeedsStrictness:
      axis->outcome = HPK_CLASS_AXIS_NEEDS_STRICTNESS;
      return HPK_OK;
    case ca::Outcome::Resolved:
      break;
  }
  axis->outcome = HPK_CLASS_AXIS_RESOLVED;
  if (!resolution) return HPK_OK;
  axis->mesh_dim = decision.mesh_dim;
  axis->relayout = decision.relayout ? 1 : 0;
  for (size_t d = 0; d < decision.want.size(); ++d) {
    axis->want[d] = ours(decision.want[d]);
    axis->rows[d] = ours(decision.rows[d]);
  }
  return HPK_OK;
}

}  // namespace

extern "C" HPK_API int32_t hpk_resolve_class_axis(const hpk_class_axis_query* query, hpk_class_axis* axis,
                                                  hpk_error* error) {
  return answer("hpk_resolve_class_axis", query, axis, error, ca::decide, true);
}

extern "C" HPK_API int32_t hpk_class_axis_mean(const hpk_class_axis_query* query, hpk_class_axis* axis,
                                               hpk_error* error) {
  return answer("hpk_class_axis_mean", query, axis, error, ca::decide_mean, false);
}

extern "C" HPK_API int64_t hpk_class_axis_expected(int32_t rows_sharded, const char* tensor, int64_t class_dim,
                                                   char* buffer, int64_t capacity) {
  try {
    const ca::Route route{false, rows_sharded != 0, text(tensor), ""};
    return copy_out(ca::expected_layout(route, class_dim), buffer, capacity);
  } catch (...) {  // out of memory: nothing C++ leaves the library
    return copy_out("", buffer, capacity);
  }
}
