#include "hyper_parallel/core/communicator.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/stack.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "compat/c10d_compat.h"
#include "hyper_parallel/core/pending_collective.h"
#include "hyper_parallel/core/collective_stats.h"
#include "core/group_description.h"

namespace hyper_parallel {

namespace {
thread_local CollectiveCounts tls_counts;
thread_local CollectiveTally tls_tally;

// Counts one collective sent to a process group, with the bytes this rank sends.
void tally_issue(CollectiveKind kind, int64_t bytes) {
  ++tls_tally.count;
  tls_tally.bytes += bytes;
  ++tls_tally.kind_count[static_cast<size_t>(kind)];
  tls_tally.kind_bytes[static_cast<size_t>(kind)] += bytes;
}

// Tallies one collective sent to a process group: from construction (before the copies
// it needs) to destruction (after its wait).
class Tallied {
 public:
  Tallied(CollectiveKind kind, int64_t bytes) : start_(std::chrono::steady_clock::now()) { tally_issue(kind, bytes); }
  ~Tallied() { tls_tally.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  Tallied(const Tallied&) = delete;
  Tallied& operator=(const Tallied&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
};

int64_t bytes_of(const at::Tensor& t) {
  return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return c10d::ReduceOp::SUM;
    case ReduceOp::Max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::Min:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// What errors call each group (group_description.h); a Communicator is not told at
// construction so that its public header stays as it is.
struct GroupDescription {
  std::string where;
  std::chrono::milliseconds timeout{0};
};
std::mutex descriptions_mutex;
std::map<const Communicator*, GroupDescription> descriptions;

// Waits for a collective issued on `comm`. A failure (a timeout above all: Gloo's own text
// names neither the group nor the setting) is rethrown naming the operation, the group,
// its ranks and, for a timeout, HP_COLLECTIVE_TIMEOUT_S.
void wait_for(const c10::intrusive_ptr<c10d::Work>& work, const Communicator& comm, const char* op) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    GroupDescription d;
    {
      std::lock_guard<std::mutex> lock(descriptions_mutex);
      const auto it = descriptions.find(&comm);
      if (it != descriptions.end()) d = it->second;
    }
    const std::string text = e.what();
    std::string ranks;
    for (int64_t r : comm.global_ranks()) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    std::string message = std::string(op) + " over " + (d.where.empty() ? "a process group" : d.where) +
                          " (global ranks " + ranks + "; this is rank " +
                          std::to_string(comm.global_ranks()[comm.rank()]) + ") failed";
    const bool timed_out = text.find("imed out") != std::string::npos || text.find("imeout") != std::string::npos;
    if (timed_out) {
      message += ": a rank of the group did not arrive within the collective timeout";
      if (d.timeout.count() > 0) {
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%g", static_cast<double>(d.timeout.count()) / 1000.0);
        message += " of " + std::string(seconds) + " s";
      }
      message += " (HP_COLLECTIVE_TIMEOUT_S sets it, in seconds): it stalled, or it died and its own error says why";
    }
    // The backend's text last, on one line: it may name the peer it waited for.
    throw std::runtime_error(message + ". " + comm.process_group()->getBackendName() + ": " +
                             text.substr(0, text.find('\n')));
  }
}

// NCCL takes CUDA tensors only; say so here rather than in NCCL's words.
void check_device(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.is_cuda() || pg->getBackendName() != "nccl", what,
              ": expected a CUDA tensor on an NCCL "
              "group, got one on ",
              t.device(), "; put it on the mesh's device (DeviceMesh::device())");
}

// Gloo's reductions are not defined for bfloat16 in every LibTorch: such buffers travel
// as float32, which holds every bfloat16 value exactly.
bool needs_float_wire(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 && pg->getBackendName() == "gloo";
}
// bfloat16 travels over Gloo as float16 bits: a gather only copies bytes, and Gloo knows
// float16 but not bfloat16 (nor int16).
at::Tensor gather_wire(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const at::Tensor& t) {
  return needs_float_wire(pg, t) ? t.view(at::kHalf) : t;
}
// The torch.chunk pieces of `full` along `dim`, each moved to dim 0 and padded at its end to
// the first (largest) piece's length: c10d's scatters need equal-sized buffers.
std::vector<at::Tensor> padded_chunks(const at::Tensor& full, int64_t dim, int64_t n) {
  const int64_t max_len = chunk_range(full.size(dim), n, 0).length;
  const at::Tensor moved = full.movedim(dim, 0);
  std::vector<at::Tensor> pieces;
  pieces.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const ChunkRange r = chunk_range(full.size(dim), n, i);
    at::Tensor piece = moved.narrow(0, r.offset, r.length).contiguous();
    if (r.length < max_len) {
      std::vector<int64_t> pad(2 * piece.dim(), 0);
      pad[pad.size() - 1] = max_len - r.length;  // pads dim 0 at the end
      piece = at::constant_pad_nd(piece, pad, 0);
    }
    pieces.push_back(piece);
  }
  return pieces;
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

Communicator::Communicator(c10::intrusive_ptr<c10d::ProcessGroup> pg, std::vector<int64_t> global_ranks)
    : pg_(std::move(pg)), global_ranks_(std::move(global_ranks)), rank_(pg_->getRank()) {
  TORCH_CHECK(pg_->getSize() == size(), "process group of size ", pg_->getSize(), " does not match the ", size(),
              " ranks it was created for");
}

Communicator::~Communicator() {
  std::lock_guard<std::mutex> lock(descriptions_mutex);
  descriptions.erase(this);
}

void Communicator::all_reduce_(at::Tensor& t, ReduceOp op) const {
  ++tls_counts.all_reduce;
  if (size() == 1) return;
  check_device(pg_, t, "all_reduce");
  Tallied tally(CollectiveKind::AllReduce, bytes_of(t));
  // c10d requires dense contiguous buffers; reduce a contiguous copy when needed.
  at::Tensor buf = needs_float_wire(pg_, t) ? t.to(at::kFloat) : t.is_contiguous() ? t : t.contiguous();
  std::vector<at::Tensor> v{buf};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  wait_for(pg_->allreduce(v, opts), *this, "all_reduce");
  if (op == ReduceOp::Avg) buf.div_(size());
  if (!buf.is_same(t)) t.copy_(buf);
}

PendingCollective::PendingCollective() = default;
PendingCollective::~PendingCollective() = default;
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;

namespace {

// A gather's recv / a reduce-scatter's send (`whole`) holds comm.size() x `part`.
void check_whole_and_part(const char* what, const Communicator& comm, const at::Tensor& whole, const char* whole_name,
                          const at::Tensor& part, const char* part_name) {
  TORCH_CHECK(whole.is_contiguous() && part.is_contiguous() && whole.numel() == comm.size() * part.numel() &&
                  whole.scalar_type() == part.scalar_type(),
              "PendingCollective::", what, ": expected contiguous buffers of one dtype, ", whole_name, " holding ",
              comm.size(), " x ", part_name, " (", part.numel(), " elements), got ", whole_name, " ",
              whole.scalar_type(), " ", whole.numel(), ", ", part_name, " ", part.scalar_type(), " ", part.numel());
}

}  // namespace

void PendingCollective::issued(Kind kind, const Communicator& comm, c10::intrusive_ptr<c10d::Work> work,
                               std::chrono::steady_clock::time_point at, at::Tensor send, at::Tensor recv) {
  kind_ = kind;
  comm_ = &comm;
  work_ = std::move(work);
  issued_ = at;
  send_ = std::move(send);
  recv_ = std::move(recv);
  static constexpr CollectiveKind kKinds[] = {CollectiveKind::AllReduce, CollectiveKind::AllGather,
                                              CollectiveKind::ReduceScatter};
  tally_issue(kKinds[static_cast<int>(kind)], bytes_of(send_));  // what this member sends
  // Stamped on the backend's thread at completion: the transfer time is known even when
  // nobody waited for it.
  completed_ns_ = std::make_shared<std::atomic<int64_t>>(-1);
  try {
    work_->getFuture()->addCallback([stamp = completed_ns_, at](c10::ivalue::Future&) {
      stamp->store(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - at).count());
    });
  } catch (const std::exception&) {
    completed_ns_->store(-2);  // a backend without futures: wait() stamps it
  }
}

PendingCollective PendingCollective::start_all_reduce(const Communicator& comm, const at::Tensor& buffer) {
  ++tls_counts.all_reduce;
  PendingCollective p;
  if (comm.size() == 1) return p;
  const auto& pg = comm.process_group();
  check_device(pg, buffer, "all_reduce");
  TORCH_CHECK(buffer.is_contiguous() && !needs_float_wire(pg, buffer),
              "PendingCollective::start_all_reduce: expected a contiguous buffer that Gloo can sum (float32 for "
              "bfloat16 data), got ",
              buffer.scalar_type(), buffer.is_contiguous() ? "" : " (not contiguous)");
  std::vector<at::Tensor> v{buffer};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  const auto now = std::chrono::steady_clock::now();
  p.issued(Kind::AllReduce, comm, pg->allreduce(v, opts), now, buffer, at::Tensor());
  return p;
}

PendingCollective PendingCollective::start_all_gather(const Communicator& comm, const at::Tensor& send,
                                                      const at::Tensor& recv) {
  ++tls_counts.all_gather;
  check_whole_and_part("start_all_gather", comm, recv, "recv", send, "send");
  PendingCollective p;
  if (comm.size() == 1) {
    recv.copy_(send.view(recv.sizes()));
    return p;
  }
  const auto& pg = comm.process_group();
  check_device(pg, send, "all_gather");
  const at::Tensor wire_send = gather_wire(pg, send).reshape({-1});
  const at::Tensor wire_recv = gather_wire(pg, recv).reshape({-1});
  std::vector<at::Tensor> outs;
  for (int64_t i = 0; i < comm.size(); ++i) outs.push_back(wire_recv.narrow(0, i * send.numel(), send.numel()));
  std::vector<std::vector<at::Tensor>> out_lists{outs};
  std::vector<at::Tensor> in{wire_send};
  const auto now = std::chrono::steady_clock::now();
  p.issued(Kind::AllGather, comm, pg->allgather(out_lists, in), now, send, recv);
  return p;
}

PendingCollective PendingCollective::start_reduce_scatter(const Communicator& comm, const at::Tensor& send,
                                                          const at::Tensor& recv) {
  ++tls_counts.reduce_scatter;
  check_whole_and_part("start_reduce_scatter", comm, send, "send", recv, "recv");
  PendingCollective p;
  if (comm.size() == 1) {
    recv.copy_(send.view(recv.sizes()));
    return p;
  }
  const auto& pg = comm.process_group();
  check_device(pg, send, "reduce_scatter");
  TORCH_CHECK(!needs_float_wire(pg, send) && !(send.scalar_type() == at::kHalf && pg->getBackendName() == "gloo"),
              "PendingCollective::start_reduce_scatter: Gloo cannot sum ", send.scalar_type(),
              "; reduce in float32 (or use NCCL)");
  const int64_t n = recv.numel();
  const auto now = std::chrono::steady_clock::now();
  if (compat::has_native_reduce_scatter(pg, send.device().type())) {
    std::vector<at::Tensor> ins;
    for (int64_t i = 0; i < comm.size(); ++i) ins.push_back(send.reshape({-1}).narrow(0, i * n, n));
    std::vector<std::vector<at::Tensor>> in_lists{ins};
    std::vector<at::Tensor> outs{recv.reshape({-1})};
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    p.issued(Kind::ReduceScatter, comm, pg->reduce_scatter(outs, in_lists, opts), now, send, recv);
  } else {
    // Gloo on CUDA tensors: the whole buffer is summed, this member keeps its segment.
    std::vector<at::Tensor> v{send};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    p.issued(Kind::ReduceScatter, comm, pg->allreduce(v, opts), now, send, recv);
    p.copy_segment_ = true;
  }
  return p;
}

void PendingCollective::wait() {
  if (!work_) return;
  const auto start = std::chrono::steady_clock::now();
  auto work = std::move(work_);
  work_.reset();
  static constexpr const char* kNames[] = {"all_reduce", "all_gather", "reduce_scatter"};
  wait_for(work, *comm_, kNames[static_cast<int>(kind_)]);
  if (copy_segment_) {
    const int64_t n = recv_.numel();
    recv_.reshape({-1}).copy_(send_.reshape({-1}).narrow(0, comm_->rank() * n, n));
  }
  const auto now = std::chrono::steady_clock::now();
  // The completion callback runs on the backend's thread just after the work completes.
  int64_t ns = completed_ns_->load();
  while (ns == -1) {
    std::this_thread::yield();
    ns = completed_ns_->load();
  }
  completed_seconds_ = ns >= 0 ? static_cast<double>(ns) * 1e-9 : std::chrono::duration<double>(now - issued_).count();
  send_ = at::Tensor();
  recv_ = at::Tensor();
  tls_tally.seconds += std::chrono::duration<double>(now - start).count();
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

at::Tensor Communicator::all_gather(const at::Tensor& local, int64_t dim, const std::vector<int64_t>& sizes) const {
  dim = c10::maybe_wrap_dim(dim, local.dim());
  TORCH_CHECK(static_cast<int64_t>(sizes.size()) == size(), "all_gather: expected ", size(), " piece sizes, got ",
              sizes.size());
  TORCH_CHECK(local.size(dim) == sizes[rank_], "all_gather: local piece has ", local.size(dim), " rows along dim ", dim,
              " but rank ", rank_, " was expected to hold ", sizes[rank_]);
  if (needs_float_wire(pg_, local)) {
    // A gather copies bytes: bfloat16 travels as float16 bits (gather_wire), not widened.
    return all_gather(gather_wire(pg_, local), dim, sizes).view(at::kBFloat16);
  }
  ++tls_counts.all_gather;
  if (size() == 1) return local;
  check_device(pg_, local, "all_gather");
  Tallied tally(CollectiveKind::AllGather, bytes_of(local));
  // Gloo needs equal-sized buffers: pad every piece to the largest along `dim`, then trim.
  // The pieces travel in their own layout (no transposing copy of a piece sharded along an
  // inner dim, as the logits are along the vocabulary) and are concatenated along `dim`, as
  // PyTorch's all_gather_into_tensor + cat do: the result is contiguous in its own dim
  // order (a transposed view made every consumer that flattens it keep its own copy).
  const int64_t max_len = *std::max_element(sizes.begin(), sizes.end());
  at::Tensor send = local.contiguous();
  const bool even = std::all_of(sizes.begin(), sizes.end(), [&](int64_t n) { return n == max_len; });
  if (even && compat::all_gather_takes_strided_outputs(pg_, local.device().type())) {
    // Equal pieces arrive straight in their blocks of the result: no concatenation, and
    // no second buffer of the whole size (the bfloat16 gather path was slower than
    // PyTorch's by about that copy).
    std::vector<int64_t> full_sizes = send.sizes().vec();
    full_sizes[dim] = max_len * size();
    at::Tensor out = at::empty(full_sizes, send.options());
    std::vector<at::Tensor> blocks;
    blocks.reserve(size());
    for (int64_t i = 0; i < size(); ++i) blocks.push_back(out.narrow(dim, i * max_len, max_len));
    std::vector<std::vector<at::Tensor>> out_lists{blocks};
    std::vector<at::Tensor> in{send};
    wait_for(pg_->allgather(out_lists, in), *this, "all_gather");
    return out;
  }
  if (send.size(dim) < max_len) {
    std::vector<int64_t> pad(2 * send.dim(), 0);
    pad[2 * (send.dim() - 1 - dim) + 1] = max_len - send.size(dim);  // pads `dim` at its end
    send = at::constant_pad_nd(send, pad, 0);
  }
  std::vector<at::Tensor> outs;
  outs.reserve(size());
  for (int64_t i = 0; i < size(); ++i) outs.push_back(at::empty_like(send));
  std::vector<std::vector<at::Tensor>> out_lists{outs};
  std::vector<at::Tensor> in{send};
  wait_for(pg_->allgather(out_lists, in), *this, "all_gather");
  std::vector<at::Tensor> pieces;
  pieces.reserve(size());
  for (int64_t i = 0; i < size(); ++i) pieces.push_back(out_lists[0][i].narrow(dim, 0, sizes[i]));
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
    Tallied tally(CollectiveKind::ReduceScatter, bytes_of(full));
    std::vector<at::Tensor> inputs = padded_chunks(full, dim, size());
    at::Tensor out = at::empty_like(inputs[0]);
    std::vector<at::Tensor> outs{out};
    std::vector<std::vector<at::Tensor>> in_lists{inputs};
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op);
    wait_for(pg_->reduce_scatter(outs, in_lists, opts), *this, "reduce_scatter");
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
  Tallied tally(CollectiveKind::Broadcast, bytes_of(t));
  at::Tensor buf = needs_float_wire(pg_, t) ? t.to(at::kFloat) : t.is_contiguous() ? t : t.contiguous();
  std::vector<at::Tensor> v{buf};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  wait_for(pg_->broadcast(v, opts), *this, "broadcast");
  if (!buf.is_same(t)) t.copy_(buf);
}

at::Tensor Communicator::scatter(const at::Tensor& full, int64_t dim, int64_t root) const {
  TORCH_CHECK(root >= 0 && root < size(), "scatter: root ", root, " is not a member of a group of ", size());
  const ChunkRange mine = chunk_range(full.size(dim), size(), rank_);
  if (needs_float_wire(pg_, full)) return scatter(full.to(at::kFloat), dim, root).to(at::kBFloat16);
  ++tls_counts.scatter;
  if (size() == 1) return full.narrow(dim, mine.offset, mine.length);
  check_device(pg_, full, "scatter");
  // The padded piece, `dim` first (as padded_chunks lays it out).
  std::vector<int64_t> piece_shape(full.sizes().begin(), full.sizes().end());
  piece_shape.erase(piece_shape.begin() + dim);
  piece_shape.insert(piece_shape.begin(), chunk_range(full.size(dim), size(), 0).length);
  at::Tensor out = at::empty(piece_shape, full.options());
  if (out.numel() == 0) return out.narrow(0, 0, mine.length).movedim(0, dim).contiguous();  // nothing to send
  Tallied tally(CollectiveKind::Scatter, rank_ == root ? bytes_of(full) : bytes_of(out));
  std::vector<std::vector<at::Tensor>> in_lists;
  if (rank_ == root) in_lists.push_back(padded_chunks(full, dim, size()));
  std::vector<at::Tensor> outs{out};
  c10d::ScatterOptions opts;
  opts.rootRank = root;
  wait_for(pg_->scatter(outs, in_lists, opts), *this, "scatter");
  // Contiguous, as PyTorch's distribute_tensor pieces are (kernels that write in place,
  // such as the fused loss's gradient in forward, need a unit innermost stride).
  return out.narrow(0, 0, mine.length).movedim(0, dim).contiguous();
}

void Communicator::barrier() const {
  ++tls_counts.barrier;
  if (size() == 1) return;
  Tallied tally(CollectiveKind::Barrier, 0);
  wait_for(pg_->barrier(), *this, "barrier");
}

void describe_group(const Communicator& comm, std::string where, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(descriptions_mutex);
  descriptions[&comm] = GroupDescription{std::move(where), timeout};
}

}  // namespace hyper_parallel
