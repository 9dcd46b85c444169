#include "loss/call_agreement.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <sstream>

#include "hyper_parallel/communicator.h"
#include "hyper_parallel/loss_parallel.h"
#include "hyper_parallel/pending_collective.h"
#include "loss/input_agreement.h"

namespace hyper_parallel {

namespace {

// The record's slots. Integers are exact in float64 up to 2^53; hashes travel as 32-bit
// pieces for that reason.
enum Slot : int64_t {
  kOpHash,
  kRows,
  kDtype,
  kVocab,
  kReduction,
  kIgnoreIndex,
  kLabelSmoothing,
  kZLoss,
  kSoftcap,
  kGradientInForward,
  kTemperature,
  kEntropy,
  kWeightHashLow,
  kWeightHashHigh,
  kLocalClasses,  // not compared: the pieces may differ
  kRecordSize
};

// What a compared slot is called in the error, and how its value reads.
struct SlotName {
  Slot slot;
  const char* what;
};
constexpr SlotName kCompared[] = {
    {kOpHash, "loss op"},
    {kRows, "row count (the logits' elements over the class dim)"},
    {kDtype, "dtype"},
    {kVocab, "vocabulary size (the global class count this rank assumes)"},
    {kReduction, "reduction"},
    {kIgnoreIndex, "ignore_index"},
    {kLabelSmoothing, "label_smoothing"},
    {kZLoss, "z_loss_weight"},
    {kSoftcap, "logit_softcap"},
    {kGradientInForward, "gradient_in_forward"},
    {kTemperature, "temperature"},
    {kEntropy, "return_entropy"},
    {kWeightHashLow, "class weight"},
    {kWeightHashHigh, "class weight"},
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

std::string readable(Slot slot, double v) {
  switch (slot) {
    case kOpHash:
      return op_name_of(v);
    case kDtype:
      return c10::toString(static_cast<at::ScalarType>(static_cast<int>(v)));
    case kReduction: {
      const int64_t r = static_cast<int64_t>(v);
      return r == 0 ? "none" : r == 1 ? "mean" : r == 2 ? "sum" : std::to_string(r);
    }
    case kGradientInForward:
    case kEntropy:
      return v != 0 ? "true" : "false";
    case kWeightHashLow:
    case kWeightHashHigh:
      return v == 0 ? "none" : "hash " + std::to_string(static_cast<int64_t>(v));
    case kRows:
    case kVocab:
    case kIgnoreIndex:
      return std::to_string(static_cast<int64_t>(v));
    default: {
      std::ostringstream s;
      s << v;
      return s.str();
    }
  }
}

}  // namespace

std::string loss_call_site(const std::string& op) {
  return op.rfind("vocab_parallel_", 0) == 0 ? op : op + " under loss_parallel";
}

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

int64_t check_vocab_pieces(const std::vector<int64_t>& counts, int64_t vocab_size) {
  const int64_t n = static_cast<int64_t>(counts.size());
  int64_t total = vocab_size;
  if (total < 0) {
    total = 0;
    for (int64_t c : counts) total += c;
  }
  std::string listed;
  for (int64_t i = 0; i < n; ++i) listed += (i ? ", " : "") + std::to_string(counts[i]);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t want = chunk_range(total, n, i).length;
    if (want != counts[i]) {
      throw LossParallelLayoutError("vocab_parallel: the members' class counts (" + listed +
                                    ") are not the torch.chunk pieces of " + std::to_string(total) +
                                    " classes: member " + std::to_string(i) + " holds " + std::to_string(counts[i]) +
                                    ", expected " + std::to_string(want));
    }
  }
  return total;
}

namespace {

// `mine` as the record's float64 slots (kRecordSize of them).
std::vector<double> record_values(const LossCallRecord& mine) {
  const uint64_t wh = weight_hash(mine.class_weight);
  std::vector<double> v(kRecordSize, 0.0);
  v[kOpHash] = static_cast<double>(op_hash(mine.op));
  v[kRows] = static_cast<double>(mine.rows);
  v[kDtype] = static_cast<double>(mine.dtype);
  v[kVocab] = static_cast<double>(mine.vocab_size);
  v[kReduction] = static_cast<double>(mine.definition.reduction);
  v[kIgnoreIndex] = static_cast<double>(mine.definition.ignore_index);
  v[kLabelSmoothing] = mine.definition.label_smoothing;
  v[kZLoss] = mine.definition.z_loss_weight;
  v[kSoftcap] = mine.definition.logit_softcap;
  v[kGradientInForward] = mine.gradient_in_forward ? 1.0 : 0.0;
  v[kTemperature] = mine.temperature;
  v[kEntropy] = mine.entropy ? 1.0 : 0.0;
  v[kWeightHashLow] = static_cast<double>(wh & 0xffffffffull);
  v[kWeightHashHigh] = static_cast<double>(wh >> 32);
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
  // Refusals first: a rank that refused may have left fields (the class weight) unset.
  if (checks_) checks_->settle(gathered_.narrow(1, kRecordSize, InputAgreement::kRecordSize), comm_);
  if (gathered_.is_meta()) return classes_;  // a dry run knows no counts
  const at::Tensor all = gathered_.cpu().contiguous();
  const double* r = all.data_ptr<double>();
  for (const SlotName& s : kCompared) {
    // Ranks grouped by their value, in rank order: every rank builds the same message.
    std::map<double, std::vector<int64_t>> by_value;
    std::vector<double> order;
    for (int64_t p = 0; p < n; ++p) {
      const double x = r[p * width + s.slot];
      if (!by_value.count(x)) order.push_back(x);
      by_value[x].push_back(p);
    }
    if (order.size() == 1) continue;
    std::string groups;
    for (double x : order) {
      std::string ranks;
      for (int64_t p : by_value[x]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(p);
      groups += (groups.empty() ? "" : "; ") + std::string("rank(s) ") + ranks + ": " + readable(s.slot, x);
    }
    // The same words on every rank, so ranks in different ops do not name their own.
    const std::string who = s.slot == kOpHash ? std::string("loss_parallel") : loss_call_site(op_);
    throw LossParallelLayoutError(who + ": the ranks of the loss's group disagree on the " + s.what + " (" + groups +
                                  "); every rank must make the same call, with the same options and inputs of the "
                                  "same shape and dtype");
  }
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

}  // namespace hyper_parallel
