// Per-token log-probabilities and entropy at a temperature, exact under vocabulary
// parallelism: what reinforcement-learning fine-tuning (PPO, GRPO) needs for every sampled
// token, with gradients through both (docs/loss_parallel.md, "Log-probabilities and entropy").
//
//   // logits: [tokens, V] sharded along V (DTensor Shard(-1)), or this rank's piece
//   hp::LogprobsOptions o;
//   o.temperature = 0.7;
//   o.return_entropy = true;
//   auto [logp, entropy] = hp::vocab_parallel_logprobs(logits, sampled_tokens, o);
//   auto loss = -(ratio_term(logp) + 0.01 * entropy).mean();  // any mix of the two
//
// log p_t = log_softmax(x / T)[t] and H = -sum_c p_c log p_c of softmax(x / T), over the whole
// vocabulary. Forward: one pass over the local logits (the temperature applied as the kernel
// reads them, never as a logits-sized pass) and ONE all-gather of four numbers per token, the
// cross-entropy's; backward: one pass, no collective. At T = 1 the log-probabilities equal
// the cross-entropy's -loss (reduction none) bit for bit. Ignored tokens (ignore_index) get 0
// for both, and no gradient.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/core/export.h"
#include "hyper_parallel/loss/loss_parallel.h"  // LossParallelLayoutError, LossParallelUnsupportedError

HP_PUBLIC_BEGIN

namespace hyper_parallel {

struct LogprobsOptions {
  double temperature = 1.0;     // > 0, 1 / T finite in the compute type: the softmax of (x - max) / T
  bool return_entropy = false;  // also the entropy of softmax(x / T) (a little more work per logit)
  int64_t ignore_index = -100;
  // The fused linear variant's blocks (FusedLinearCrossEntropyOptions has their meaning; 0:
  // automatic); the other functions do not read them.
  int64_t chunk_tokens = 0;
  int64_t vocab_block = 0;
};

struct Logprobs {
  at::Tensor logprobs;  // [tokens shape]: log p(target | x / T)
  at::Tensor entropy;   // [tokens shape], or undefined without return_entropy
};

// What backward needs besides the inputs ([rows], compute type).
struct LogprobsSaved {
  // max_c x_c (the logits' units, not divided by T) and log sum_c exp((x_c - row_max) / T):
  // log p_c = (x_c - row_max) / T - log_sum, the difference taken before it is scaled.
  at::Tensor row_max, log_sum;
  // sum_c p_c (x_c - row_max) / T (<= 0; the entropy is log_sum minus it), which the entropy's
  // gradient needs; undefined without return_entropy.
  at::Tensor mean_difference;
  int64_t vocab_size = -1;  // the vocabulary forward used (learnt when given < 0)
};

// On class-sharded logits: a DTensor whose last dim (the classes) is sharded, as loss_parallel
// takes them, or a plain tensor (one process). target: class indices of the logits' shape
// without the last dim (plain or Replicate). Returns Replicate DTensors (plain tensors for
// plain logits) in the logits' dtype, differentiable with respect to the logits.
Logprobs vocab_parallel_logprobs(const at::Tensor& logits, const at::Tensor& target,
                                 const LogprobsOptions& options = {});

// Fused with the head on DTensors, as fused_linear_cross_entropy takes them (fused_linear_loss.h):
// hidden [tokens, dim] plain (the same on every rank) or a Replicate DTensor; weight the
// ColwiseParallel head's Shard(0) DTensor [V, dim] on a 1-D mesh, or a plain tensor (one
// process); target [tokens]. The logits never exist. Returns Replicate DTensors (plain for a
// plain weight); hidden's gradient is summed over the mesh (one all-reduce), the weight's is
// its shard.
Logprobs fused_linear_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                               const LogprobsOptions& options = {});

// On plain local pieces and a communicator (vocab_parallel.h's style: forward/backward with
// explicit saved values, for a caller that owns the graph, such as the Python package's op).
// local_logits: this member's torch.chunk piece of the classes along class_dim. vocab_size < 0:
// learnt from the members' counts in the call's record. Bad input is the same error on
// every member.
Logprobs vocab_parallel_logprobs_forward(const at::Tensor& local_logits, int64_t class_dim, const at::Tensor& target,
                                         const Communicator* comm, int64_t vocab_size, const LogprobsOptions& options,
                                         LogprobsSaved* saved);
// d / d local_logits for incoming gradients of the log-probabilities and of the entropy
// (either may be undefined: none). No collective.
at::Tensor vocab_parallel_logprobs_backward(const at::Tensor& grad_logprobs, const at::Tensor& grad_entropy,
                                            const at::Tensor& local_logits, int64_t class_dim, const at::Tensor& target,
                                            const LogprobsSaved& saved, const Communicator* comm, int64_t vocab_size,
                                            const LogprobsOptions& options);

// The same from hidden [tokens, dim] x this member's rows of the [V, dim] head, without the
// logits ever existing (the fused linear cross-entropy's blocks, fused_linear_loss.h).
Logprobs vocab_parallel_linear_logprobs_forward(const at::Tensor& hidden, const at::Tensor& local_weight,
                                                const at::Tensor& target, const Communicator* comm, int64_t vocab_size,
                                                const LogprobsOptions& options, LogprobsSaved* saved);
// {d / d hidden (summed over the members: one all-reduce), d / d local_weight}; either
// undefined when not asked for.
std::vector<at::Tensor> vocab_parallel_linear_logprobs_backward(
    const at::Tensor& grad_logprobs, const at::Tensor& grad_entropy, const at::Tensor& hidden,
    const at::Tensor& local_weight, const at::Tensor& target, const LogprobsSaved& saved, const Communicator* comm,
    int64_t vocab_size, const LogprobsOptions& options, bool hidden_grad, bool weight_grad);

}  // namespace hyper_parallel

HP_PUBLIC_END
