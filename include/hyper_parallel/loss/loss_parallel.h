// loss_parallel: exact cross-entropy on logits sharded along the class (vocabulary)
// dimension, without gathering them (docs/design.md: the math; docs/loss_parallel.md: the use).
//
//   {
//     auto guard = hp::loss_parallel();                  // RAII, thread-local
//     auto loss = torch::nn::functional::cross_entropy(logits, targets);  // DTensor logits
//     loss.backward();                                    // zero collectives
//   }
//
// Inside the guard, OpDispatcher routes the ops in loss_parallel_op_names() (the ops
// cross_entropy / log_softmax / nll_loss decompose into) to distributed kernels:
//   K1 distributed stable log-softmax   (all-reduce MAX + all-reduce SUM)
//   K2 index NLL with ignore_index, class weights, none/mean/sum (one all-reduce)
//   K3 the fused cross_entropy           (one all-gather forward, none backward)
// each after one small fixed-size all-gather in which the ranks agree on the call (rows,
// dtype, vocabulary, options): a difference is the same LossParallelLayoutError everywhere.
// A log_softmax whose output feeds anything else (KL, a log-prob gather, a sum) gets the
// correct backward with one all-reduce. Backward kernels are chosen by the layout of
// their inputs, not by the guard, so backward may run on any thread.
// See docs/loss_parallel.md for the support matrix, errors and PyTorch differences.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/export.h"
#include "hyper_parallel/loss/loss_terms.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// The logits (or target/weight) do not have the layout loss_parallel needs; the message
// names the expected layout and what was found.
class LossParallelLayoutError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A combination loss_parallel does not support (yet).
class LossParallelUnsupportedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The terms (LossTerms, z_loss_weight and logit_softcap) are the two fields of cross_entropy's
// definition (cross_entropy_definition.h) that the call cannot pass: cross_entropy under this
// guard adds them to the call's ignore_index, reduction and label_smoothing. log_softmax /
// nll_loss under a guard that sets either raise LossParallelUnsupportedError rather than
// silently ignoring them.
struct LossParallelOptions : LossTerms {
  // LossParallelOptions{mesh, strict}: the layout fields by position, as before the terms
  // moved into the base (a base would otherwise come first in an aggregate's braces).
  LossParallelOptions(std::optional<DeviceMesh> mesh = std::nullopt, std::optional<bool> strict = std::nullopt)
      : mesh(std::move(mesh)), strict(strict) {}

  // The TP mesh. Unset: inferred from the logits (their 1-D mesh, or the mesh dim that
  // shards the class dim). Set: the logits must live on it.
  std::optional<DeviceMesh> mesh;
  // true: PyTorch 2.15's N-D contract (docs/loss_parallel.md, "Layouts on N-D meshes"), else
  // LossParallelLayoutError. false: other layouts re-laid out (a warning), 'mean' exact.
  // Unset: ParallelismConfig::loss_parallel_strict_mesh (default true).
  std::optional<bool> strict;
  // Allows the loss to write d loss / d logits into the logits' own storage during
  // forward (no logits-sized gradient buffer; backward only scales it). The logits'
  // version counter is bumped, so any other autograd user that saved them raises instead
  // of reading the gradient; reading the logits after the loss gives the gradient. Used
  // when the logits require grad and their local rows are contiguous in the class dim;
  // otherwise the loss runs as without it.
  bool gradient_in_forward = false;
};

class LossParallelGuard {
 public:
  explicit LossParallelGuard(const LossParallelOptions& options = {});
  ~LossParallelGuard();
  LossParallelGuard(LossParallelGuard&& other) noexcept;
  LossParallelGuard(const LossParallelGuard&) = delete;
  LossParallelGuard& operator=(const LossParallelGuard&) = delete;
  LossParallelGuard& operator=(LossParallelGuard&&) = delete;

 private:
  bool engaged_ = false;
};

// Enters the context for the calling thread until the guard is destroyed. Re-entrant:
// an inner guard with no options, or the same options, nests (depth counter); an
// inner guard whose options contradict the outer one's is a LossParallelLayoutError.
LossParallelGuard loss_parallel(const LossParallelOptions& options = {});
bool is_loss_parallel_active();
// Nesting depth on this thread (0 outside).
int64_t loss_parallel_depth();
// The options in force on this thread (meaningful while active).
LossParallelOptions current_loss_parallel_options();

// Runs fn inside the context.
template <typename Fn>
auto with_loss_parallel(Fn&& fn, const LossParallelOptions& options = {}) {
  auto guard = loss_parallel(options);
  return fn();
}

// The op names (get_op_name) routed to dispatch_loss_parallel inside the context.
std::vector<std::string> loss_parallel_op_names();
// Adds names (tests, extensions). A routed name without a kernel raises
// LossParallelUnsupportedError naming it, never a silently different result.
void register_loss_parallel_op_names(const std::vector<std::string>& names);

}  // namespace hyper_parallel

HP_PUBLIC_END
