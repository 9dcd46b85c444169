#include "loss/call/call_agreement.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/loss/loss_parallel.h"
#include "hyper_parallel/core/pending_collective.h"
#include "loss/call/class_sharding.h"
#include "loss/call/input_agreement.h"

namespace hyper_parallel {

namespace {

// A shape in the record: its rank, its first kMaxDims dims, and a 32-bit hash of all of them
// (for longer shapes; -1 stands for a dim recorded as free, the class dim).
constexpr int64_t kMaxDims = 6;
constexpr int64_t kShapeSlots = 2 + kMaxDims;

// The record's slots. Integers are exact in float64 up to 2^53; hashes travel as 32-bit
// pieces for that reason.
enum Slot : int64_t {
  // What decides which collectives the call makes (a refusal's message exchange included),
  // known to every rank whatever its inputs: compared before the ranks' refusals are settled.
  kOpHash,
  kInContext,
  kStrict,
  kVocabKnown,
  // The rest, compared once no rank refused its inputs.
  kRows,
  kDtype,
  kVocab,
  kClassDim,
  kLogitsShape,
  kTargetKind = kLogitsShape + kShapeSlots,
  kTargetShape,
  kHiddenDim = kTargetShape + kShapeSlots,
  kReduction,
  kIgnoreIndex,
  kLabelSmoothing,
  kZLoss,
  kSoftcap,
  kGradientInForward,
  kTemperature,
  kEntropy,
  kWeightHash,                      // two slots
  kLocalClasses = kWeightHash + 2,  // not compared: the pieces may differ
  kRecordSize
};
constexpr int64_t kStructuralSlots = kRows;  // kOpHash .. kVocabKnown

enum class Format { number, integer, op, dtype, reduction, boolean, hash, shape, target_kind, context, strict, vocab };

// A compared field: its slots, what the error calls it, how its value reads.
struct Field {
  int64_t slot;
  int64_t width;
  const char* what;
  Format format;
};
constexpr Field kStructural[] = {
    {kOpHash, 1, "loss op", Format::op},
    {kInContext, 1, "loss_parallel context", Format::context},
    {kStrict, 1, "loss_parallel strictness", Format::strict},
    {kVocabKnown, 1, "vocabulary's source", Format::vocab},
};
constexpr Field kCompared[] = {
    {kRows, 1, "row count (the logits' elements over the class dim)", Format::integer},
    {kDtype, 1, "dtype", Format::dtype},
    {kVocab, 1, "vocabulary size (the global class count this rank assumes)", Format::integer},
    {kClassDim, 1, "class dim", Format::integer},
    {kLogitsShape, kShapeSlots, "logits' shape (* the class dim)", Format::shape},
    {kTargetKind, 1, "target kind", Format::target_kind},
    {kTargetShape, kShapeSlots, "target's shape (* a probability target's class dim)", Format::shape},
    {kHiddenDim, 1, "hidden size (the hidden states' last dim)", Format::integer},
    {kReduction, 1, "reduction", Format::reduction},
    {kIgnoreIndex, 1, "ignore_index", Format::integer},
    {kLabelSmoothing, 1, "label_smoothing", Format::number},
    {kZLoss, 1, "z_loss_weight", Format::number},
    {kSoftcap, 1, "logit_softcap", Format::number},
    {kGradientInForward, 1, "gradient_in_forward", Format::boolean},
    {kTemperature, 1, "temperature", Format::number},
    {kEntropy, 1, "return_entropy", Format::boolean},
    {kWeightHash, 2, "class weight", Format::hash},
};

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// A hash of the class weights' values, dtype and length (0: none).
uint64_t weight_hash(const at::Tensor& w) {
  if (!w.defined() || w.is_meta()) return 0;
  const at::Tensor c = w.to(at::kCPU).contiguous();
  uint64_t h = fnv1a(c.data_ptr(), c.nbytes());
  const int64_t meta[2] = {static_cast<int64_t>(c.scalar_type()), c.numel()};
  return fnv1a(meta, sizeof(meta), h) | 1;  // never 0, which stands for "no weight"
}

uint64_t op_hash(const std::string& op) { return fnv1a(op.data(), op.size()) & 0xffffffffull; }

// The loss ops that make a LossCallRecord, so that every rank can name every rank's op.
constexpr const char* kLossOps[] = {"cross_entropy",
                                    "log_softmax",
                                    "nll_loss",
                                    "vocab_parallel_cross_entropy",
                                    "vocab_parallel_log_softmax",
                                    "vocab_parallel_nll_loss",
                                    "vocab_parallel_linear_cross_entropy",
                                    "fused_linear_cross_entropy",
                                    "vocab_parallel_logprobs",
                                    "vocab_parallel_linear_logprobs"};

std::string op_name_of(double hash) {
  for (const char* op : kLossOps) {
    if (static_cast<double>(op_hash(op)) == hash) return op;
  }
  return "an op with hash " + std::to_string(static_cast<int64_t>(hash));
}

std::string shape_text(const double* v) {
  const int64_t ndim = static_cast<int64_t>(v[0]);
  if (ndim < 0) return "none";
  std::string s = "[";
  for (int64_t d = 0; d < std::min(ndim, kMaxDims); ++d) {
    const int64_t x = static_cast<int64_t>(v[1 + d]);
    s += (d ? ", " : "") + (x < 0 ? std::string("*") : std::to_string(x));
  }
  if (ndim > kMaxDims) s += ", ... (" + std::to_string(ndim) + " dims)";
  return s + "]";
}

std::string readable(const Field& f, const double* v) {
  switch (f.format) {
    case Format::op:
      return op_name_of(v[0]);
    case Format::dtype:
      return c10::toString(static_cast<at::ScalarType>(static_cast<int>(v[0])));
    case Format::reduction: {
      const int64_t r = static_cast<int64_t>(v[0]);
      return r == 0 ? "none" : r == 1 ? "mean" : r == 2 ? "sum" : std::to_string(r);
    }
    case Format::boolean:
      return v[0] != 0 ? "true" : "false";
    case Format::context: {
      const auto c = static_cast<LossContext>(static_cast<int64_t>(v[0]));
      return c == LossContext::inside    ? "inside loss_parallel()"
             : c == LossContext::outside ? "outside loss_parallel()"
                                         : "none recorded (a function on local pieces)";
    }
    case Format::strict:
      return v[0] != 0 ? "strict" : "not strict";
    case Format::vocab:
      return v[0] != 0 ? "vocab_size given" : "vocab_size None (learnt from the pieces)";
    case Format::target_kind: {
      const auto k = static_cast<LossTargetKind>(static_cast<int64_t>(v[0]));
      return k == LossTargetKind::index         ? "class indices"
             : k == LossTargetKind::probability ? "probabilities (floating point)"
                                                : "none";
    }
    case Format::hash: {
      if (v[0] == 0 && v[1] == 0) return "none";
      const uint64_t h = static_cast<uint64_t>(v[0]) | (static_cast<uint64_t>(v[1]) << 32);
      return "hash " + std::to_string(h);
    }
    case Format::shape:
      return shape_text(v);
    case Format::integer:
      return std::to_string(static_cast<int64_t>(v[0]));
    case Format::number:
    default: {
      std::ostringstream s;
      s << v[0];
      return s.str();
    }
  }
}

// Throws the same LossParallelLayoutError on every rank when `f` differs between the `n`
// records of `width` slots in `r` (every rank holds all of them, so all build the same words).
void compare_field(const Field& f, const double* r, int64_t n, int64_t width, const std::string& op) {
  std::map<std::vector<double>, std::vector<int64_t>> by_value;
  std::vector<std::vector<double>> order;
  for (int64_t p = 0; p < n; ++p) {
    std::vector<double> x(r + p * width + f.slot, r + p * width + f.slot + f.width);
    if (!by_value.count(x)) order.push_back(x);
    by_value[x].push_back(p);
  }
  if (order.size() == 1) return;
  std::string groups;
  for (const auto& x : order) {
    std::string ranks;
    for (int64_t p : by_value[x]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(p);
    groups += (groups.empty() ? "" : "; ") + std::string("rank(s) ") + ranks + ": " + readable(f, x.data());
  }
  // The same words on every rank, so ranks in different ops do not name their own.
  const std::string who = f.slot == kOpHash ? std::string("loss_parallel") : loss_call_site(op);
  throw LossParallelLayoutError(who + ": the ranks of the loss's group disagree on the " + f.what + " (" + groups +
                                "); every rank must make the same call, with the same options and inputs of the "
                                "same shape and dtype");
}

void write_shape(double* v, const std::vector<int64_t>& shape, bool defined) {
  if (!defined) {
    v[0] = -1;
    return;
  }
  const int64_t ndim = static_cast<int64_t>(shape.size());
  v[0] = static_cast<double>(ndim);
  for (int64_t d = 0; d < std::min(ndim, kMaxDims); ++d) v[1 + d] = static_cast<double>(shape[d]);
  v[1 + kMaxDims] = static_cast<double>(fnv1a(shape.data(), shape.size() * sizeof(int64_t)) & 0xffffffffull);
}

}  // namespace

void record_guard_cross_entropy_options(LossCallRecord& call) {
  if (!is_loss_parallel_active()) return;
  const LossParallelOptions o = current_loss_parallel_options();
  call.definition.z_loss_weight = o.z_loss_weight;
  call.definition.logit_softcap = o.logit_softcap;
}

int64_t rows_over_class_dim(const at::Tensor& t, int64_t class_dim) {
  int64_t rows = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d != class_dim) rows *= t.size(d);
  }
  return rows;
}

void record_logits(LossCallRecord& call, const at::Tensor& local_logits, int64_t class_dim) {
  call.rows = rows_over_class_dim(local_logits, class_dim);
  call.dtype = static_cast<int64_t>(local_logits.scalar_type());
  call.class_dim = class_dim;
  call.logits_shape = local_logits.sizes().vec();
  if (class_dim >= 0 && class_dim < local_logits.dim()) {
    call.local_classes = local_logits.size(class_dim);
    call.logits_shape[class_dim] = -1;
  }
}

void record_target(LossCallRecord& call, const at::Tensor& target, int64_t class_dim) {
  if (!target.defined()) return;
  call.target_kind = target.is_floating_point() ? LossTargetKind::probability : LossTargetKind::index;
  call.target_shape = target.sizes().vec();
  if (call.target_kind == LossTargetKind::probability && class_dim >= 0 && class_dim < target.dim())
    call.target_shape[class_dim] = -1;
}

void record_context(LossCallRecord& call) {
  const bool active = is_loss_parallel_active();
  call.context = active ? LossContext::inside : LossContext::outside;
  call.strict = active && effective_strict(current_loss_parallel_options());
}

namespace {

// `mine` as the record's float64 slots (kRecordSize of them).
std::vector<double> record_values(const LossCallRecord& mine) {
  const uint64_t wh = weight_hash(mine.class_weight);
  std::vector<double> v(kRecordSize, 0.0);
  v[kOpHash] = static_cast<double>(op_hash(mine.op));
  v[kInContext] = static_cast<double>(static_cast<int64_t>(mine.context));
  v[kStrict] = mine.strict ? 1.0 : 0.0;
  v[kVocabKnown] = mine.vocab_size >= 0 ? 1.0 : 0.0;
  v[kRows] = static_cast<double>(mine.rows);
  v[kDtype] = static_cast<double>(mine.dtype);
  v[kVocab] = static_cast<double>(mine.vocab_size);
  v[kClassDim] = static_cast<double>(mine.class_dim);
  write_shape(&v[kLogitsShape], mine.logits_shape, !mine.logits_shape.empty() || mine.class_dim >= 0);
  v[kTargetKind] = static_cast<double>(static_cast<int64_t>(mine.target_kind));
  write_shape(&v[kTargetShape], mine.target_shape, mine.target_kind != LossTargetKind::none);
  v[kHiddenDim] = static_cast<double>(mine.hidden_dim);
  v[kReduction] = static_cast<double>(mine.definition.reduction);
  v[kIgnoreIndex] = static_cast<double>(mine.definition.ignore_index);
  v[kLabelSmoothing] = mine.definition.label_smoothing;
  v[kZLoss] = mine.definition.z_loss_weight;
  v[kSoftcap] = mine.definition.logit_softcap;
  v[kGradientInForward] = mine.gradient_in_forward ? 1.0 : 0.0;
  v[kTemperature] = mine.temperature;
  v[kEntropy] = mine.entropy ? 1.0 : 0.0;
  v[kWeightHash] = static_cast<double>(wh & 0xffffffffull);
  v[kWeightHash + 1] = static_cast<double>(wh >> 32);
  v[kLocalClasses] = static_cast<double>(mine.local_classes);
  return v;
}

}  // namespace

PendingCallAgreement::PendingCallAgreement(const LossCallRecord& mine, const Communicator* comm,
                                           const c10::Device& device, const InputAgreement* checks)
    : op_(mine.op), local_classes_(mine.local_classes), comm_(comm), checks_(checks) {
  if (!comm || comm->size() == 1) return;
  const int64_t n = comm->size();
  const int64_t width = kRecordSize + InputAgreement::kRecordSize;
  if (device.is_meta()) {
    // A dry run: the collective is counted, there are no values to compare.
    gathered_ = comm->all_gather(at::empty({1, width}, at::TensorOptions().dtype(at::kDouble).device(device)), 0,
                                 std::vector<int64_t>(n, 1));
    return;
  }
  at::Tensor record = at::zeros({1, width}, at::kDouble);
  record.narrow(1, 0, kRecordSize).copy_(at::tensor(record_values(mine), at::kDouble).unsqueeze(0));
  if (checks) checks->write_record(record[0].narrow(0, kRecordSize, InputAgreement::kRecordSize));
  record = record.to(device);
  gathered_ = at::empty({n, width}, record.options());
  gather_ = std::make_unique<PendingCollective>(PendingCollective::start_all_gather(*comm, record, gathered_));
}

PendingCallAgreement::~PendingCallAgreement() = default;

std::vector<int64_t> PendingCallAgreement::settle() {
  if (settled_) return classes_;
  settled_ = true;
  if (!comm_ || comm_->size() == 1) {
    if (checks_) {
      const at::Tensor own = at::zeros({1, InputAgreement::kRecordSize}, at::kDouble);
      checks_->write_record(own[0]);
      checks_->settle(own, nullptr);
    }
    classes_ = {local_classes_};
    return classes_;
  }
  const int64_t n = comm_->size();
  const int64_t width = kRecordSize + InputAgreement::kRecordSize;
  if (gather_) gather_->wait();
  if (gathered_.is_meta()) {
    // A dry run knows no counts, and has no values to compare; this rank's own refusal stops it.
    if (checks_) checks_->settle(gathered_.narrow(1, kRecordSize, InputAgreement::kRecordSize), comm_);
    return classes_;
  }
  const at::Tensor all = gathered_.cpu().contiguous();
  const double* r = all.data_ptr<double>();
  // What decides the collectives first: ranks in different ops, contexts or vocabulary
  // sources would otherwise settle refusals through different collectives.
  for (const Field& f : kStructural) compare_field(f, r, n, width, op_);
  // Refusals next: a rank that refused may have left fields (the class weight) unset. Every
  // rank reads every record's refusal, with or without checks of its own, so that all of
  // them take the refusal's message exchange together.
  const at::Tensor records = gathered_.narrow(1, kRecordSize, InputAgreement::kRecordSize);
  if (checks_) {
    checks_->settle(records, comm_);
  } else {
    InputAgreement(op_, at::Tensor(), [] {}).settle(records, comm_);
  }
  for (const Field& f : kCompared) compare_field(f, r, n, width, op_);
  classes_.resize(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) classes_[p] = static_cast<int64_t>(r[p * width + kLocalClasses]);
  return classes_;
}

VocabPiece PendingCallAgreement::settle_learnt_vocabulary() {
  const std::vector<int64_t> counts = settle();
  const int64_t n = comm_ ? comm_->size() : 1;
  return vocab_piece(comm_, local_classes_, counts.empty() ? local_classes_ * n : check_vocab_pieces(counts, -1));
}

std::vector<int64_t> agree_on_call(const LossCallRecord& mine, const Communicator* comm, const c10::Device& device,
                                   const InputAgreement* checks) {
  return PendingCallAgreement(mine, comm, device, checks).settle();
}

int64_t learn_vocabulary(const std::string& op, int64_t local_classes, const Communicator* comm,
                         const c10::Device& device) {
  LossCallRecord call;
  call.op = op;
  call.local_classes = local_classes;  // vocab_size -1: to be learnt
  return PendingCallAgreement(call, comm, device).settle_learnt_vocabulary().total;
}

void agree_on_context(const LossCallRecord& mine, const std::vector<const Communicator*>& comms,
                      const c10::Device& device) {
  // Every rank's structural slots as [lowest..., highest...], narrowed group by group: after
  // the groups of every mesh dim, each rank holds the extremes over the whole mesh, so every
  // rank of it reaches the same verdict (and the same words, which can name values only).
  // Sent in a record's width, so that a rank that meets another rank's call record here (a
  // caller that decided differently) gets an error, not a Gloo abort on mismatched sizes.
  const int64_t width = kRecordSize + InputAgreement::kRecordSize;
  const std::vector<double> v = record_values(mine);
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor extremes = at::zeros({1, width}, opts);
  for (int64_t i = 0; i < kStructuralSlots; ++i) {
    extremes[0][i] = v[i];
    extremes[0][kStructuralSlots + i] = v[i];
  }
  for (const Communicator* comm : comms) {
    if (!comm || comm->size() == 1) continue;
    const int64_t n = comm->size();
    if (device.is_meta()) {  // a dry run: counted, nothing compared
      comm->all_gather(at::empty({1, width}, opts.device(device)), 0, std::vector<int64_t>(n, 1));
      continue;
    }
    const at::Tensor all = comm->all_gather(extremes.to(device), 0, std::vector<int64_t>(n, 1)).cpu();
    extremes.narrow(1, 0, kStructuralSlots).copy_(std::get<0>(all.narrow(1, 0, kStructuralSlots).min(0, true)));
    extremes.narrow(1, kStructuralSlots, kStructuralSlots)
        .copy_(std::get<0>(all.narrow(1, kStructuralSlots, kStructuralSlots).max(0, true)));
  }
  if (device.is_meta()) return;
  const double* e = extremes.data_ptr<double>();
  for (const Field& f : kStructural) {
    const double lo = e[f.slot], hi = e[kStructuralSlots + f.slot];
    if (lo == hi) continue;
    throw LossParallelLayoutError(loss_call_site(mine.op) + ": the ranks of the loss's mesh disagree on the " + f.what +
                                  " (" + readable(f, &lo) + " on some, " + readable(f, &hi) +
                                  " on others); every rank must make the same call, with the same options");
  }
}

}  // namespace hyper_parallel
