// Vocabulary-parallel losses on plain local tensors: each member of a process group holds
// the torch.chunk piece of the classes that DTensor's Shard of the class dim gives it (the
// Megatron / TorchTitan style, and what the Python package's ops and its loss_parallel on
// PyTorch's DTensor call). The kernels are loss_parallel's (docs/design.md has the math):
//   cross-entropy   one all-gather forward (which also settles the input checks on every
//                   member), no collective backward; backward needs only what forward returns
//   log_softmax     two all-reduces forward, one backward (correct for any consumer)
//   nll_loss        one all-reduce forward, none backward
// Every forward first all-gathers one small fixed-size record in which the members agree on
// the call (rows, dtype, vocabulary, options; nll_loss's input checks ride in it): a
// difference is the same LossParallelLayoutError on every member, never a Gloo abort.
// Functions come in forward/backward pairs with explicit saved values, so that a caller
// (torch.library's autograd, a compiler) owns the graph.
#pragma once

#include <ATen/core/Reduction.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/loss/cross_entropy_definition.h"
#include "hyper_parallel/loss/loss_parallel.h"  // LossParallelLayoutError, LossParallelUnsupportedError
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// This member's classes: torch.chunk piece comm->rank() of `total` classes.
struct VocabPiece {
  int64_t offset = 0;
  int64_t local = 0;
  int64_t total = 0;
};

// The piece a member holding `local_classes` classes has. vocab_size >= 0: checked against
// torch.chunk (the caller runs it where a refusal reaches every member). vocab_size < 0:
// learnt from every member's count in one all-gather, then checked the same way on every
// member. A null comm is one process.
VocabPiece vocab_piece(const Communicator* comm, int64_t local_classes, int64_t vocab_size);

// The vocabulary the members' torch.chunk pieces make up, for a call of `op` (e.g.
// "vocab_parallel_nll_loss") that needs it before its own collectives: learnt in that op's
// call record (one small all-gather on `device`), so that it is the same first collective a
// member given the vocabulary makes, and members that disagree on giving it are the same
// named LossParallelLayoutError on every member, not out of step.
int64_t learn_vocab_size(const std::string& op, int64_t local_classes, const Communicator* comm,
                         const c10::Device& device);

// For a front end that decides alone, before its call's first collective, whether to refuse a
// layout or to gather the logits' other mesh dims, by the loss_parallel context's strictness
// (a loss on a mesh of more than one dim): the members of `groups` agree on `op` and `strict`
// first, or every member raises the same LossParallelLayoutError. One group (the one sharding
// the classes, where nothing is gathered): one record, the same first collective the members
// that go on make (their call's record of `op`; they were not strict). Several (every mesh
// dim's, where the logits are gathered next): one small all-gather per group, after which
// every member of the mesh knows whether all of them agree.
void agree_on_loss_strictness(const std::string& op, bool strict, const std::vector<const Communicator*>& groups,
                              const c10::Device& device);

// For a DTensor loss that loss_parallel() would own, called outside it on class-sharded
// logits, before its refusal (or its fallback's gather): the record of `op` (the op the
// ranks inside the context make, e.g. "vocab_parallel_cross_entropy" from Python) on the
// group sharding the classes, saying "outside", so that a context entered on some ranks
// only is the same LossParallelLayoutError on every rank. One small all-gather, on that
// error or fallback path only.
void agree_outside_loss_parallel(const std::string& op, const Communicator* group, const c10::Device& device);

// The cross-entropy's definition (cross_entropy_definition.h) and how it runs.
struct VocabCrossEntropyOptions : CrossEntropyDefinition {
  // Forward writes d loss / d logits (for a unit incoming gradient) over local_logits, when
  // their rows have a unit class stride (else it runs as without): no logits-sized gradient
  // buffer, backward only scales it. The caller makes sure nothing else needs the values.
  bool gradient_in_forward = false;
};

// What the cross-entropy's backward needs besides its inputs ([rows], compute type).
struct VocabCrossEntropySaved {
  at::Tensor row_max, log_sum;    // lse = row_max + log_sum, kept apart (fused_cross_entropy.h)
  at::Tensor row_weight;          // probability targets: sum_c w_c q'_c; index targets: recomputed
  at::Tensor grad_rows;           // gradient_in_forward: the gradient written over the logits' rows
  int64_t vocab_size = -1;        // forward: the vocabulary it used (learnt when given < 0)
  at::Tensor mean_denominator{};  // forward: what 'mean' divides this member's rows by (compute type)
};

// Cross-entropy of `local_logits` (this member's classes along `class_dim`). target: class
// indices of the logits' shape without the class dim, the same on every member, or
// probabilities of the local logits' shape (this member's classes). weight: [vocab] or
// none. Returns the loss in the logits' dtype ([rows shape] for None, a scalar otherwise).
// Bad input is the same error on every member (LossParallelLayoutError, c10::IndexError ...).
at::Tensor vocab_parallel_cross_entropy_forward(const at::Tensor& local_logits, int64_t class_dim,
                                                const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                                const Communicator* comm, int64_t vocab_size,
                                                const VocabCrossEntropyOptions& options, VocabCrossEntropySaved* saved);
// d loss / d local_logits for the incoming gradient `grad_loss`. No collective. After a
// forward that wrote the gradient (saved.grad_rows), that storage scaled in place.
at::Tensor vocab_parallel_cross_entropy_backward(const at::Tensor& grad_loss, const at::Tensor& local_logits,
                                                 int64_t class_dim, const at::Tensor& target,
                                                 const std::optional<at::Tensor>& weight,
                                                 const VocabCrossEntropySaved& saved, const Communicator* comm,
                                                 int64_t vocab_size, const VocabCrossEntropyOptions& options);

// log_softmax over all classes; the result has local's shape, in `out_dtype` (local's
// dtype when unset).
at::Tensor vocab_parallel_log_softmax(const at::Tensor& local, int64_t class_dim, const Communicator* comm,
                                      int64_t vocab_size, std::optional<at::ScalarType> out_dtype = std::nullopt);
at::Tensor vocab_parallel_log_softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t class_dim,
                                               const Communicator* comm, int64_t vocab_size,
                                               at::ScalarType input_dtype);

// nll_loss on log-probabilities: {output, total_weight}, as ATen's nll_loss_forward.
std::vector<at::Tensor> vocab_parallel_nll_loss_forward(const at::Tensor& local_logp, int64_t class_dim,
                                                        const at::Tensor& target,
                                                        const std::optional<at::Tensor>& weight, int64_t reduction,
                                                        int64_t ignore_index, const Communicator* comm,
                                                        int64_t vocab_size);
at::Tensor vocab_parallel_nll_loss_backward(const at::Tensor& grad_output, const at::Tensor& local_logp,
                                            int64_t class_dim, const at::Tensor& target,
                                            const std::optional<at::Tensor>& weight, int64_t reduction,
                                            int64_t ignore_index, const at::Tensor& total_weight,
                                            const Communicator* comm, int64_t vocab_size);

}  // namespace hyper_parallel

HP_PUBLIC_END
