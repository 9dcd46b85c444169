// The ranks of a loss's group agree on the call itself before any collective sized by it.
//
// Every loss kernel's collectives are sized by this rank's rows, and every rank combines the
// others' statistics under its own options. Ranks whose row counts or dtypes differ would
// hand Gloo buffers of different sizes (a SIGABRT, no message), and ranks whose options
// differ would each return a plausible but wrong loss. So each forward first all-gathers one
// fixed-size record of what must be equal on every rank (the op; whether it runs under
// loss_parallel() and how strictly; whether the vocabulary was given, and the vocabulary
// this rank believes in; the rows, the logits' shape, class dim and dtype; the target's
// kind and shape; the fused losses' hidden size; every option that changes the result; a
// hash of the class weights) and of what may differ (this rank's class count). Every rank
// reads every record the same way: a difference is the same LossParallelLayoutError on
// every rank, naming the field and the ranks, before anything sized by rows is sent. What
// a rank decides alone (its op, its context, whether to learn the vocabulary) never changes
// this first collective, only the values in it.
//
// Cost: one all-gather of kRecordSize float64 values per forward (latency only), in flight
// while the fused cross-entropies compute their local statistics (PendingCallAgreement);
// where the vocabulary is learnt from the ranks' class counts it replaces that count's
// all-gather (and is waited for first: the counts place this rank's classes).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hyper_parallel/loss/cross_entropy_definition.h"
#include "hyper_parallel/loss/vocab_parallel.h"  // VocabPiece
#include "loss/call/loss_call_site.h"
#include "loss/call/vocab_pieces.h"

namespace hyper_parallel {

class Communicator;
class PendingCollective;
class InputAgreement;

// What a loss's target holds, which changes the loss it computes.
enum class LossTargetKind : int64_t { none = 0, index = 1, probability = 2 };
// Where a loss call runs with respect to loss_parallel().
enum class LossContext : int64_t { none = 0, inside = 1, outside = 2 };

// What one rank is about to compute. Fields an op has no use for keep their defaults (they
// are then equal on every rank).
struct LossCallRecord {
  std::string op;                     // e.g. "cross_entropy"; ranks in different loss ops disagree on it
  int64_t rows = 0;                   // logits rows: every dim but the class dim, flattened
  int64_t dtype = -1;                 // the logits' (or hidden's) at::ScalarType
  int64_t vocab_size = -1;            // the global vocabulary this rank assumes (-1: to be learnt)
  int64_t local_classes = 0;          // this rank's classes (may differ between ranks)
  int64_t class_dim = -1;             // of the logits (-1: none, the fused linear losses)
  std::vector<int64_t> logits_shape;  // every dim, the class dim's as -1 (its size may differ); empty: none
  LossTargetKind target_kind = LossTargetKind::none;
  std::vector<int64_t> target_shape;  // a probability target's class dim as -1, like the logits'
  int64_t hidden_dim = -1;            // the fused linear losses' hidden size (-1: none)
  // Whether the call runs under loss_parallel() (the DTensor routes: inside; a DTensor loss
  // the context would own, called outside it: outside; the functions on local pieces: none),
  // and its effective strictness there: what decides, on each rank alone, whether the call
  // refuses a layout or which collectives gather it.
  LossContext context = LossContext::none;
  bool strict = false;
  CrossEntropyDefinition definition;  // nll_loss: its reduction and ignore_index
  bool gradient_in_forward = false;
  double temperature = 1.0;  // the log-probabilities'
  bool entropy = false;      // the log-probabilities': whether the entropy is computed too
  at::Tensor class_weight;   // hashed when defined (its values, dtype and length)
};

// The logits' rows, dtype, class dim, shape and this rank's class count into `call`.
void record_logits(LossCallRecord& call, const at::Tensor& local_logits, int64_t class_dim);
// The target's kind (index or probability: its dtype decides, as F.cross_entropy's) and shape
// into `call`; a probability target's class dim is recorded as the logits' is (-1).
void record_target(LossCallRecord& call, const at::Tensor& target, int64_t class_dim);
// Whether the C++ loss_parallel guard is active on this thread, and its effective strictness.
void record_context(LossCallRecord& call);

// For log_softmax and nll_loss: the loss_parallel guard's cross-entropy-only options (z-loss,
// soft-cap) into `call`, so that a guard that differs between ranks is named on every rank;
// where every rank has them, they are refused after the record (on every rank alike).
void record_guard_cross_entropy_options(LossCallRecord& call);

// The rows a loss sees in `t`: the product of every dim but class_dim (0 classes included).
int64_t rows_over_class_dim(const at::Tensor& t, int64_t class_dim);

// One fixed-size all-gather of every rank's LossCallRecord on `device` (the logits' device, so
// that NCCL can carry it; a meta device is a dry run: counted, nothing compared). Throws
// LossParallelLayoutError on every rank when any compared field differs between ranks.
// `checks`, when given, rides along and is settled first (the same error on every rank
// when any rank refused its inputs). Returns every rank's local_classes (this
// rank's alone for a null or one-member comm; empty for a dry run, which knows none).
std::vector<int64_t> agree_on_call(const LossCallRecord& mine, const Communicator* comm, const c10::Device& device,
                                   const InputAgreement* checks = nullptr);

// agree_on_call in two steps, for a forward with local work to do before its first
// collective sized by rows: the record's all-gather is issued here and travels while this
// rank computes, so that its latency is not added to the forward's; settle() waits for it
// and compares (the same errors, the same result as agree_on_call). Settle before that
// first collective. A rank that throws in between has sent its record: the others' settle()
// returns and their next collective fails within its timeout, as without the overlap.
class PendingCallAgreement {
 public:
  PendingCallAgreement(const LossCallRecord& mine, const Communicator* comm, const c10::Device& device,
                       const InputAgreement* checks = nullptr);
  ~PendingCallAgreement();
  PendingCallAgreement(const PendingCallAgreement&) = delete;
  PendingCallAgreement& operator=(const PendingCallAgreement&) = delete;
  // What agree_on_call returns; later calls return it again without waiting.
  std::vector<int64_t> settle();
  // For a call whose vocabulary is the members' classes together (vocab_size < 0): settles,
  // then returns this member's piece of their sum, every member's count checked on every
  // member (the same verdict everywhere). A dry run knows no counts: its pieces are even.
  VocabPiece settle_learnt_vocabulary();

 private:
  std::string op_;
  int64_t local_classes_ = 0;
  const Communicator* comm_ = nullptr;
  const InputAgreement* checks_ = nullptr;
  at::Tensor gathered_;  // [members, record + input-agreement record]
  std::unique_ptr<PendingCollective> gather_;
  bool settled_ = false;
  std::vector<int64_t> classes_;
};

// The vocabulary the members' torch.chunk pieces make up, learnt in a record of `op` whose
// vocabulary is unknown: the same first collective as the op's own record, so that members
// that learn the vocabulary and members given it are the same named error, not out of step.
// For a call that needs the vocabulary before its own record (its checks do).
int64_t learn_vocabulary(const std::string& op, int64_t local_classes, const Communicator* comm,
                         const c10::Device& device);

// For a decision each rank takes alone before any collective of the call (whether to refuse
// a layout, whether to gather other mesh dims): the ranks of every group in `comms` (a
// mesh's dims, whose groups together span it) agree on `mine`'s op, context and
// strictness first, or every rank raises the same LossParallelLayoutError. One small
// all-gather per group, the call's first collective on each rank.
void agree_on_context(const LossCallRecord& mine, const std::vector<const Communicator*>& comms,
                      const c10::Device& device);

}  // namespace hyper_parallel
