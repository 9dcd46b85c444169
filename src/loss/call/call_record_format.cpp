// call_record_format.h: a call record's slots, written from a LossCallRecord and read back for
// the error that names the ranks which differ.
#include "loss/call/call_record_format.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "hyper_parallel/loss/loss_parallel.h"

namespace hyper_parallel {
namespace call_record_format {

namespace {

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

}  // namespace call_record_format
}  // namespace hyper_parallel
