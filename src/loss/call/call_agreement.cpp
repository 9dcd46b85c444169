// call_agreement.h: the ranks' agreement on a loss call, one all-gather of their records (in
// call_record_format.h's slots) compared field by field; also on its context across the groups
// of a mesh, and the vocabulary learnt from the ranks' class counts.
#include "loss/call/call_agreement.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/core/pending_collective.h"
#include "hyper_parallel/loss/loss_parallel.h"
#include "loss/call/call_record_format.h"
#include "loss/call/input_agreement.h"

namespace hyper_parallel {

PendingCallAgreement::PendingCallAgreement(const LossCallRecord& mine, const Communicator* comm,
                                           const c10::Device& device, const InputAgreement* checks)
    : op_(mine.op), local_classes_(mine.local_classes), comm_(comm), checks_(checks) {
  using namespace call_record_format;  // the record's slots
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
  using namespace call_record_format;  // the record's slots
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
  using namespace call_record_format;  // the record's slots
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
