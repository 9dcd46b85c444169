// The loss front ends' input checks, one home for all of them (internal): the cross-entropy
// definition, the targets, the class weights, the gradients the losses do not give. The DTensor
// route (cross_entropy under loss_parallel), the functions on local pieces (vocab_parallel_*)
// and the fused linear + cross-entropy each call these, so one rule cannot differ between them.
// A front end runs them inside its InputAgreement, which makes a refusal the same error on
// every member.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Optional.h>

#include <string>

#include "hyper_parallel/loss/cross_entropy_definition.h"

namespace hyper_parallel {

// What a bad option raises. The DTensor route raises what PyTorch's cross_entropy raises for
// the same argument (c10::Error: Python RuntimeError); the functions on local pieces and the
// fused linear loss raise c10::ValueError (Python ValueError), as their Python ops document.
enum class OptionErrorKind { runtime_error, value_error };

// reduction is None, Mean or Sum; label_smoothing in [0, 1]; z_loss_weight and logit_softcap
// finite and >= 0. The message names `op` and the field.
void check_cross_entropy_definition(const CrossEntropyDefinition& definition, const std::string& op,
                                    OptionErrorKind kind);
// The class dim of logits given to a function on local pieces, wrapped (negative: from the
// end); logits with no dim are refused (c10::ValueError naming `op`).
int64_t logits_class_dim(const at::Tensor& logits, int64_t class_dim, const std::string& op);
// Throws c10::IndexError (as ATen does) for a target outside [0, C) other than ignore_index.
void check_targets(const at::Tensor& target, int64_t num_classes, int64_t ignore_index);
// PyTorch's rule for probability targets: an ignore_index >= 0 is refused
// (LossParallelUnsupportedError, with ATen's words), a negative one (its default -100
// included) has no effect. Every front end that takes probability targets asks this.
void check_probability_target_ignore_index(int64_t ignore_index, const std::string& op);
// nll_loss's input checks, as strict as ATen's: the target's dtype (Long or Byte) and shape
// (logp_shape without the class dim; logp_shape may be the global or the local shape, only its
// other dims are read), the class weight's length (num_classes) and dtype (the log-probs'),
// the reduction, then the targets' range. Throws what ATen would (c10::ValueError,
// c10::IndexError ...), naming `op`.
void check_nll_inputs(c10::IntArrayRef logp_shape, at::ScalarType logp_dtype, int64_t class_dim,
                      const at::Tensor& target, const c10::optional<at::Tensor>& weight, int64_t num_classes,
                      int64_t reduction, int64_t ignore_index, const std::string& op);
// As PyTorch's nll_loss: class indices are int64 (or uint8), not int32 or floating point. Raises
// `kind` (ATen's words), naming `op`.
void check_index_target_dtype(const at::Tensor& target, const std::string& op, OptionErrorKind kind);
// A class weight for `num_classes` classes: [num_classes] (`described`: how the message shows
// what was given; empty: its sizes), in `input`'s dtype (check_class_weight_dtype). Raises `kind`
// for the shape.
void check_class_weight(const at::Tensor& weight, int64_t num_classes, at::ScalarType input,
                        const std::string& input_name, const std::string& op, OptionErrorKind kind,
                        const std::string& described = {});
// As PyTorch's cross_entropy and nll_loss: a class weight of another dtype than `input` (the
// logits, log-probabilities or hidden states, named by `input_name`) is refused, not converted.
void check_class_weight_dtype(at::ScalarType input, const at::Tensor& weight, const std::string& input_name,
                              const std::string& op);
// The fused linear losses' plain local pieces: hidden [tokens, dim] and this rank's weight rows
// [V_local, dim] of one floating dtype, with the target on one device. Raises c10::ValueError
// (c10::Error for the devices), naming `op`.
void check_linear_pieces(const at::Tensor& hidden, const at::Tensor& local_weight, const at::Tensor& target,
                         const std::string& op);
// The fused losses' block sizes (chunk_tokens, vocab_block): >= 0, 0 automatic (c10::ValueError).
void check_block_sizes(int64_t chunk_tokens, int64_t vocab_block, const std::string& op);
// The losses give no gradient to a target or a class weight: asking for one is refused
// (LossParallelUnsupportedError naming `op`), not dropped.
void check_no_target_or_weight_grad(const at::Tensor& target, const c10::optional<at::Tensor>& weight,
                                    const std::string& op);

}  // namespace hyper_parallel
