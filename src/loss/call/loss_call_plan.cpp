// loss_call_plan.h: the sequence every loss front end runs, once.
#include "loss/call/loss_call_plan.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "hyper_parallel/core/communicator.h"
#include "loss/call/vocab_pieces.h"
#include "loss/kernel/cross_entropy_cpu_kernel.h"

namespace hyper_parallel {

namespace {

ClassShard shard_of(const ClassLayout& layout, const VocabPiece& piece) {
  return ClassShard{layout.comm, piece.offset, piece.local, piece.total};
}

// The layout's vocabulary and class count are the record's.
void record_layout(LossCallRecord& record, const ClassLayout& layout) {
  record.vocab_size = layout.vocab_size;
  record.local_classes = layout.local_classes;
}

// This rank's piece from every member's class count (empty for a dry run, which knows none:
// this rank's own piece, the pieces even where the vocabulary is unknown).
VocabPiece piece_from_counts(const std::vector<int64_t>& counts, const ClassLayout& layout) {
  const int64_t n = layout.comm ? layout.comm->size() : 1;
  const int64_t total = !counts.empty()          ? check_vocab_pieces(counts, layout.vocab_size)
                        : layout.vocab_size >= 0 ? layout.vocab_size
                                                 : layout.local_classes * n;
  return vocab_piece(layout.comm, layout.local_classes, total);
}

}  // namespace

LossCallPlan::LossCallPlan(const std::string& op, const LossCallSteps& steps) : verdict_(steps.verdict) {
  LossCallRecord record;
  record.op = op;
  ClassLayout layout;
  if (steps.describe) steps.describe(record, layout);
  const bool placed = layout.offset >= 0;
  VocabPiece piece{placed ? layout.offset : 0, layout.local_classes, layout.vocab_size};
  const auto checks = [&] {
    if (steps.checks) steps.checks(shard_of(layout, piece));
  };
  if (verdict_ == CheckVerdict::with_statistics) {
    // 1. The record first: every rank's first collective, whatever it decides next.
    record_layout(record, layout);
    agreement_ = std::make_unique<PendingCallAgreement>(record, layout.comm, layout.device);
    // 2. The members' counts place this rank's classes: no collective of their own.
    if (!placed && layout.vocab_size < 0) piece = agreement_->settle_learnt_vocabulary();
    // 3. Every check inside the agreement, the piece first: a refusal on one rank is the same
    // error on every rank, settled in the statistics' all-gather.
    inputs_ = std::make_unique<InputAgreement>(op, steps.replicated, [&] {
      if (!placed && layout.vocab_size >= 0) piece = vocab_piece(layout.comm, layout.local_classes, layout.vocab_size);
      checks();
    });
  } else {
    // The checks first, their verdict in the record. Checks that need an unknown vocabulary
    // learn it before them, in a record of this op (one all-gather more).
    if (steps.describe && !placed && layout.vocab_size < 0 && steps.checks) {
      layout.vocab_size = learn_vocabulary(op, layout.local_classes, layout.comm, layout.device);
      piece.total = layout.vocab_size;
    }
    inputs_ = std::make_unique<InputAgreement>(op, steps.replicated, checks);
  }
  // 4. Placeholders: this rank still joins every collective, which settle the refusal everywhere.
  if (inputs_->refused() && steps.placeholders) steps.placeholders();
  if (verdict_ == CheckVerdict::in_record) {
    if (steps.after_checks) steps.after_checks(record, layout);
    record_layout(record, layout);
    agreement_ = std::make_unique<PendingCallAgreement>(record, layout.comm, layout.device, inputs_.get());
    piece = layout.offset >= 0 ? VocabPiece{layout.offset, layout.local_classes, layout.vocab_size}
                               : piece_from_counts(agreement_->settle(), layout);
  }
  shard_ = shard_of(layout, piece);
  if (inputs_->refused()) {
    // The placeholders' classes: this rank's count, of a vocabulary that holds them.
    shard_.local = layout.local_classes;
    shard_.total = std::max(shard_.total, shard_.local);
  }
}

LossCallPlan::~LossCallPlan() = default;

at::Tensor LossCallPlan::statistics(int64_t rows, const at::TensorOptions& options,
                                    const std::function<at::Tensor()>& compute) {
  const at::Tensor stats = refused() ? at::zeros({ce_kernel::kStats, rows}, options) : compute();
  settle();
  return stats;
}

ClassShard agree_on_loss_call(LossCallRecord record, const ClassLayout& layout) {
  record_layout(record, layout);
  const std::vector<int64_t> counts = agree_on_call(record, layout.comm, layout.device);
  if (layout.offset >= 0) return ClassShard{layout.comm, layout.offset, layout.local_classes, layout.vocab_size};
  return shard_of(layout, piece_from_counts(counts, layout));
}

}  // namespace hyper_parallel
