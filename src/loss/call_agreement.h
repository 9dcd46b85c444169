// The ranks of a loss's group agree on the call itself before any collective sized by it.
//
// Every loss kernel's collectives are sized by this rank's rows, and every rank combines the
// others' statistics under its own options. Ranks whose row counts or dtypes differ would
// hand Gloo buffers of different sizes (a SIGABRT, no message), and ranks whose options
// differ would each return a plausible but wrong loss. So each forward first all-gathers one
// fixed-size record of what must be equal on every rank (the op, the rows, the dtype, the
// vocabulary this rank believes in, every option that changes the result, a hash of the
// class weights) and of what may differ (this rank's class count). Every rank reads every
// record the same way: a difference is the same LossParallelLayoutError on every rank,
// naming the field and the ranks, before anything sized by rows is sent.
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

#include "hyper_parallel/cross_entropy_definition.h"
#include "hyper_parallel/vocab_parallel.h"  // VocabPiece

namespace hyper_parallel {

class Communicator;
class PendingCollective;
class InputAgreement;

// What one rank is about to compute. Fields an op has no use for keep their defaults (they
// are then equal on every rank).
struct LossCallRecord {
  std::string op;                     // e.g. "cross_entropy"; ranks in different loss ops disagree on it
  int64_t rows = 0;                   // logits rows: every dim but the class dim, flattened
  int64_t dtype = -1;                 // the logits' (or hidden's) at::ScalarType
  int64_t vocab_size = -1;            // the global vocabulary this rank assumes (-1: to be learnt)
  int64_t local_classes = 0;          // this rank's classes (may differ between ranks)
  CrossEntropyDefinition definition;  // nll_loss: its reduction and ignore_index
  bool gradient_in_forward = false;
  double temperature = 1.0;  // the log-probabilities'
  bool entropy = false;      // the log-probabilities': whether the entropy is computed too
  at::Tensor class_weight;   // hashed when defined (its values, dtype and length)
};

// How errors name the call: "<op> under loss_parallel" for the DTensor route's ops, the bare
// name for the functions on local pieces (vocab_parallel_*), which no context surrounds.
std::string loss_call_site(const std::string& op);

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

// Throws LossParallelLayoutError, the same on every member, unless `counts` (every member's
// class count) are torch.chunk's pieces of `vocab_size` classes; vocab_size < 0: of their sum.
// Returns the vocabulary.
int64_t check_vocab_pieces(const std::vector<int64_t>& counts, int64_t vocab_size);

}  // namespace hyper_parallel
