#include "hyper_parallel/communicator.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>

#include "compat/c10d_compat.h"
#include "core/async_all_reduce.h"
#include "core/collective_stats.h"

namespace hyper_parallel {

namespace {
thread_local CollectiveCounts tls_counts;
thread_local CollectiveTally tls_tally;

// Tallies one collective sent to a process group: from construction (before the copies
// it needs) to destruction (after its wait).
class Tallied {
 public:
  explicit Tallied(int64_t bytes) : start_(std::chrono::steady_clock::now()) {
    ++tls_tally.count;
    tls_tally.bytes += bytes;
  }
  ~Tallied() { tls_tally.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  Tallied(const Tallied&) = delete;
  Tallied& operator=(const Tallied&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
};

int64_t bytes_of(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()); }

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return c10d::ReduceOp::SUM;
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

void wait(const c10::intrusive_ptr<c10d::Work>& work) { work->wait(); }

// NCCL takes CUDA tensors only; say so here rather than in NCCL's words.
void check_device(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.is_cuda() || pg->getBackendName() != "nccl", what, ": expected a CUDA tensor on an NCCL "
              "group, got one on ", t.device(), "; put it on the mesh's device (DeviceMesh::device())");
}

// Gloo's reductions are not defined for bfloat16 in every LibTorch: such buffers travel
// as float32, which holds every bfloat16 value exactly.
bool needs_float_wire(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 && pg->getBackendName() == "gloo";
}
}  // namespace

CollectiveCounts collective_counts() { return tls_counts; }
CollectiveTally collective_tally() { return tls_tally; }
void reset_collective_counts() { tls_counts = CollectiveCounts{}; }

ChunkRange chunk_range(int64_t size, int64_t n, int64_t index) {
  const int64_t chunk = n == 0 ? 0 : (size + n - 1) / n;
  const int64_t begin = std::min(size, chunk * index);
  const int64_t end = std::min(size, chunk * (index + 1));
  return {begin, end - begin};
}

Communicator::Communicator(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                           std::vector<int64_t> global_ranks)
    : pg_(std::move(pg)), global_ranks_(std::move(global_ranks)), rank_(pg_->getRank()) {
  TORCH_CHECK(pg_->getSize() == size(), "process group of size ", pg_->getSize(),
              " does not match the ", size(), " ranks it was created for");
}

Communicator::~Communicator() = default;

void Communicator::all_reduce_(at::Tensor& t, ReduceOp op) const {
  ++tls_counts.all_reduce;
  if (size() == 1) return;
  check_device(pg_, t, "all_reduce");
  Tallied tally(bytes_of(t));
  // c10d requires dense contiguous buffers; reduce a contiguous copy when needed.
  at::Tensor buf = needs_float_wire(pg_, t) ? t.to(at::kFloat) : t.is_contiguous() ? t : t.contiguous();
  std::vector<at::Tensor> v{buf};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  wait(pg_->allreduce(v, opts));
  if (op == ReduceOp::Avg) buf.div_(size());
  if (!buf.is_same(t)) t.copy_(buf);
}

PendingAllReduce::PendingAllReduce() = default;
PendingAllReduce::~PendingAllReduce() = default;
PendingAllReduce::PendingAllReduce(PendingAllReduce&&) noexcept = default;
PendingAllReduce& PendingAllReduce::operator=(PendingAllReduce&&) noexcept = default;

PendingAllReduce PendingAllReduce::start(const Communicator& comm, const at::Tensor& buffer) {
  ++tls_counts.all_reduce;
  PendingAllReduce p;
  if (comm.size() == 1) return p;
  const auto& pg = comm.process_group();
  check_device(pg, buffer, "all_reduce");
  TORCH_CHECK(buffer.is_contiguous() && !needs_float_wire(pg, buffer),
              "PendingAllReduce: expected a contiguous buffer that Gloo can sum (float32 for bfloat16 "
              "data), got ", buffer.scalar_type(), buffer.is_contiguous() ? "" : " (not contiguous)");
  ++tls_tally.count;
  tls_tally.bytes += bytes_of(buffer);
  std::vector<at::Tensor> v{buffer};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  p.work_ = pg->allreduce(v, opts);
  p.buffer_ = buffer;
  return p;
}

void PendingAllReduce::wait() {
  if (!work_) return;
  const auto start = std::chrono::steady_clock::now();
  auto work = std::move(work_);
  work_.reset();
  work->wait();
  buffer_ = at::Tensor();
  tls_tally.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Communicator::all_reduce_many_(std::vector<at::Tensor>& ts, ReduceOp op) const {
  if (ts.empty()) return;
  if (ts.size() == 1) return all_reduce_(ts[0], op);
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (auto& t : ts) {
    TORCH_CHECK(t.scalar_type() == ts[0].scalar_type(), "all_reduce_many_ expects one dtype");
    flat.push_back(t.reshape({-1}));
  }
  at::Tensor buf = at::cat(flat);
  all_reduce_(buf, op);
  int64_t off = 0;
  for (auto& t : ts) {
    t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

at::Tensor Communicator::all_gather(const at::Tensor& local, int64_t dim,
                                    const std::vector<int64_t>& sizes) const {
  TORCH_CHECK(static_cast<int64_t>(sizes.size()) == size(), "all_gather: expected ", size(),
              " piece sizes, got ", sizes.size());
  TORCH_CHECK(local.size(dim) == sizes[rank_], "all_gather: local piece has ", local.size(dim),
              " rows along dim ", dim, " but rank ", rank_, " was expected to hold ", sizes[rank_]);
  if (needs_float_wire(pg_, local)) {
    return all_gather(local.to(at::kFloat), dim, sizes).to(at::kBFloat16);
  }
  ++tls_counts.all_gather;
  if (size() == 1) return local;
  check_device(pg_, local, "all_gather");
  Tallied tally(bytes_of(local));
  // Gloo needs equal-sized buffers: pad every piece to the largest, then trim.
  const int64_t max_len = *std::max_element(sizes.begin(), sizes.end());
  at::Tensor send = local.movedim(dim, 0).contiguous();
  if (send.size(0) < max_len) {
    std::vector<int64_t> pad(2 * send.dim(), 0);
    pad[pad.size() - 1] = max_len - send.size(0);  // pads dim 0 at the end
    send = at::constant_pad_nd(send, pad, 0);
  }
  std::vector<at::Tensor> outs;
  outs.reserve(size());
  for (int64_t i = 0; i < size(); ++i) outs.push_back(at::empty_like(send));
  std::vector<std::vector<at::Tensor>> out_lists{outs};
  std::vector<at::Tensor> in{send};
  wait(pg_->allgather(out_lists, in));
  // Concatenated along `dim` itself, so the result is contiguous in its own dim order: a
  // transposed view (cat on dim 0, then movedim) made every consumer that flattens it
  // (each linear reading a gathered sequence) keep its own contiguous copy for backward.
  std::vector<at::Tensor> pieces;
  pieces.reserve(size());
  for (int64_t i = 0; i < size(); ++i) pieces.push_back(out_lists[0][i].narrow(0, 0, sizes[i]).movedim(0, dim));
  return at::cat(pieces, dim);
}

at::Tensor Communicator::reduce_scatter(const at::Tensor& full, int64_t dim, ReduceOp op) const {
  const ChunkRange mine = chunk_range(full.size(dim), size(), rank_);
  if (size() == 1) {
    ++tls_counts.reduce_scatter;
    return full.narrow(dim, mine.offset, mine.length);
  }
  check_device(pg_, full, "reduce_scatter");
  if (compat::has_native_reduce_scatter(pg_, full.device().type()) && op != ReduceOp::Avg) {
    ++tls_counts.reduce_scatter;
    Tallied tally(bytes_of(full));
    const int64_t max_len = chunk_range(full.size(dim), size(), 0).length;
    at::Tensor moved = full.movedim(dim, 0);
    std::vector<at::Tensor> inputs;
    for (int64_t i = 0; i < size(); ++i) {
      ChunkRange r = chunk_range(full.size(dim), size(), i);
      at::Tensor piece = moved.narrow(0, r.offset, r.length).contiguous();
      if (r.length < max_len) {
        std::vector<int64_t> pad(2 * piece.dim(), 0);
        pad[pad.size() - 1] = max_len - r.length;
        piece = at::constant_pad_nd(piece, pad, 0);
      }
      inputs.push_back(piece);
    }
    at::Tensor out = at::empty_like(inputs[0]);
    std::vector<at::Tensor> outs{out};
    std::vector<std::vector<at::Tensor>> in_lists{inputs};
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op);
    wait(pg_->reduce_scatter(outs, in_lists, opts));
    return out.narrow(0, 0, mine.length).movedim(0, dim);
  }
  // Gloo on CUDA tensors: all-reduce the whole buffer, keep our piece. Same result,
  // counted as the all-reduce it really is.
  at::Tensor buf = full.clone(at::MemoryFormat::Contiguous);
  all_reduce_(buf, op);
  return buf.narrow(dim, mine.offset, mine.length);
}

void Communicator::broadcast_(at::Tensor& t, int64_t root) const {
  ++tls_counts.broadcast;
  if (size() == 1) return;
  check_device(pg_, t, "broadcast");
  Tallied tally(bytes_of(t));
  at::Tensor buf = needs_float_wire(pg_, t) ? t.to(at::kFloat) : t.is_contiguous() ? t : t.contiguous();
  std::vector<at::Tensor> v{buf};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  wait(pg_->broadcast(v, opts));
  if (!buf.is_same(t)) t.copy_(buf);
}

void Communicator::barrier() const {
  ++tls_counts.barrier;
  if (size() == 1) return;
  Tallied tally(0);
  wait(pg_->barrier());
}

}  // namespace hyper_parallel
