// The package's torch.library ops (namespace hyper_parallel_cpp), registered from C++: the
// kernels for CPU and CUDA tensors and their autograd, so that a Python call is one
// dispatcher call into C++ (Python custom ops with Python autograd cost several times the
// kernels on small inputs). Their fake kernels are Python's (hyper_parallel_cpp/ops.py), what
// torch.compile reads; the Python functions there are the public API.
//
// Each loss is a pair: the forward op (its result and what backward needs, the
// vocabulary it used as a 0-dim int64 tensor) and the backward op, which autograd calls so
// that a compiled graph holds both as single nodes.
#include <ATen/core/dispatch/Dispatcher.h>
#include <pybind11/pybind11.h>
#include <torch/autograd.h>
#include <torch/csrc/Exceptions.h>
#include <torch/library.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <tuple>

#include "group_communicator.h"

namespace hyper_parallel_python {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;
using OptTensor = std::optional<at::Tensor>;

// The op `name` of this library, typed, for the autograd kernels to call below autograd.
template <typename Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// A kernel whose library errors reach Python as the package's classes (a LossParallelLayoutError
// is a ValueError there), not as the RuntimeError torch makes of any other C++ exception.
[[noreturn]] void raise_in_python(PyObject* type, const std::exception& e) {
  pybind11::gil_scoped_acquire gil;
  PyErr_SetString(type, e.what());
  torch::throw_python_error();
}

template <auto Kernel>
struct RaisingPythonErrors;
template <typename R, typename... Args, R (*Kernel)(Args...)>
struct RaisingPythonErrors<Kernel> {
  static R call(Args... args) {
    try {
      return Kernel(args...);
    } catch (const hp::LossParallelLayoutError& e) {
      raise_in_python(error_types().layout, e);
    } catch (const hp::LossParallelUnsupportedError& e) {
      raise_in_python(error_types().unsupported, e);
    }
  }
};

// Autograd's answer for a forward of `inputs` inputs: the given gradients first, none for the rest.
variable_list input_gradients(size_t inputs, std::initializer_list<Tensor> leading) {
  variable_list out(inputs);
  std::copy(leading.begin(), leading.end(), out.begin());
  return out;
}

Tensor vocab_tensor(int64_t vocab) { return at::scalar_tensor(vocab, at::TensorOptions().dtype(at::kLong)); }
Tensor or_undefined(const OptTensor& t) { return t && t->defined() ? *t : Tensor(); }
// An empty tensor stands for "none" among a forward's outputs (a schema's outputs are tensors).
Tensor or_empty(const Tensor& t, const Tensor& like) { return t.defined() ? t : like.new_empty({0}); }

// --- cross-entropy -----------------------------------------------------------------------

using CrossEntropyOutputs = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;

CrossEntropyOutputs cross_entropy(const Tensor& logits, const Tensor& target, const OptTensor& weight,
                                  std::string_view group, int64_t vocab_size, int64_t class_dim, int64_t ignore_index,
                                  int64_t reduction, double label_smoothing, double z_loss_weight,
                                  double logit_softcap) {
  hp::VocabCrossEntropySaved saved;
  const Tensor loss = hp::vocab_parallel_cross_entropy_forward(
      logits, class_dim, target, defined_or_none(weight), communicator(group).get(), vocab_size,
      ce_options(ignore_index, reduction, label_smoothing, z_loss_weight, logit_softcap), &saved);
  return {loss, saved.row_max, saved.log_sum, or_empty(saved.row_weight, saved.row_max),
          vocab_tensor(saved.vocab_size)};
}

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, const OptTensor& weight,
                              const Tensor& row_max, const Tensor& log_sum, const Tensor& row_weight,
                              const Tensor& vocab_size, std::string_view group, int64_t class_dim, int64_t ignore_index,
                              int64_t reduction, double label_smoothing, double z_loss_weight, double logit_softcap) {
  const hp::VocabCrossEntropySaved saved{row_max, log_sum, row_weight.numel() ? row_weight : Tensor(), Tensor()};
  return hp::vocab_parallel_cross_entropy_backward(
      grad, logits, class_dim, target, defined_or_none(weight), saved, communicator(group).get(),
      vocab_size.item<int64_t>(), ce_options(ignore_index, reduction, label_smoothing, z_loss_weight, logit_softcap));
}

struct CrossEntropyFunction : torch::autograd::Function<CrossEntropyFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& logits, const Tensor& target,
                               const OptTensor& weight, std::string_view group, int64_t vocab_size, int64_t class_dim,
                               int64_t ignore_index, int64_t reduction, double label_smoothing, double z_loss_weight,
                               double logit_softcap) {
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = op_handle<decltype(cross_entropy)>("hyper_parallel_cpp::vocab_parallel_cross_entropy");
    auto [loss, row_max, log_sum, row_weight, vocab] =
        op.call(logits, target, weight, group, vocab_size, class_dim, ignore_index, reduction, label_smoothing,
                z_loss_weight, logit_softcap);
    ctx->save_for_backward({logits, target, or_undefined(weight), row_max, log_sum, row_weight, vocab});
    ctx->saved_data["group"] = std::string(group);
    ctx->saved_data["ints"] = std::vector<int64_t>{class_dim, ignore_index, reduction};
    ctx->saved_data["floats"] = std::vector<double>{label_smoothing, z_loss_weight, logit_softcap};
    ctx->mark_non_differentiable({row_max, log_sum, row_weight, vocab});
    return {loss, row_max, log_sum, row_weight, vocab};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    Tensor grad;
    if (ctx->needs_input_grad(0) && grads[0].defined()) {
      static const auto op =
          op_handle<decltype(cross_entropy_backward)>("hyper_parallel_cpp::vocab_parallel_cross_entropy_backward");
      const auto ints = ctx->saved_data["ints"].toIntVector();
      const auto floats = ctx->saved_data["floats"].toDoubleVector();
      grad =
          op.call(grads[0], s[0], s[1], s[2].defined() ? OptTensor(s[2]) : std::nullopt, s[3], s[4], s[5], s[6],
                  ctx->saved_data["group"].toStringRef(), ints[0], ints[1], ints[2], floats[0], floats[1], floats[2]);
    }
    return input_gradients(11, {grad});
  }
};

CrossEntropyOutputs cross_entropy_autograd(const Tensor& logits, const Tensor& target, const OptTensor& weight,
                                           std::string_view group, int64_t vocab_size, int64_t class_dim,
                                           int64_t ignore_index, int64_t reduction, double label_smoothing,
                                           double z_loss_weight, double logit_softcap) {
  const variable_list out =
      CrossEntropyFunction::apply(logits, target, weight, group, vocab_size, class_dim, ignore_index, reduction,
                                  label_smoothing, z_loss_weight, logit_softcap);
  return {out[0], out[1], out[2], out[3], out[4]};
}

// --- log_softmax and nll_loss --------------------------------------------------------------

Tensor log_softmax(const Tensor& local, int64_t class_dim, std::string_view group, int64_t vocab_size) {
  return hp::vocab_parallel_log_softmax(local, class_dim, communicator(group).get(), vocab_size);
}

Tensor log_softmax_backward(const Tensor& grad, const Tensor& output, int64_t class_dim, std::string_view group,
                            int64_t vocab_size) {
  return hp::vocab_parallel_log_softmax_backward(grad, output, class_dim, communicator(group).get(), vocab_size,
                                                 output.scalar_type());
}

struct LogSoftmaxFunction : torch::autograd::Function<LogSoftmaxFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& local, int64_t class_dim, std::string_view group,
                        int64_t vocab_size) {
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = op_handle<decltype(log_softmax)>("hyper_parallel_cpp::vocab_parallel_log_softmax");
    Tensor out = op.call(local, class_dim, group, vocab_size);
    ctx->save_for_backward({out});
    ctx->saved_data["group"] = std::string(group);
    ctx->saved_data["ints"] = std::vector<int64_t>{class_dim, vocab_size};
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        op_handle<decltype(log_softmax_backward)>("hyper_parallel_cpp::vocab_parallel_log_softmax_backward");
    const auto ints = ctx->saved_data["ints"].toIntVector();
    return input_gradients(4, {op.call(grads[0], ctx->get_saved_variables()[0], ints[0],
                                       ctx->saved_data["group"].toStringRef(), ints[1])});
  }
};

Tensor log_softmax_autograd(const Tensor& local, int64_t class_dim, std::string_view group, int64_t vocab_size) {
  return LogSoftmaxFunction::apply(local, class_dim, group, vocab_size);
}

std::tuple<Tensor, Tensor> nll_loss(const Tensor& logp, const Tensor& target, const OptTensor& weight,
                                    int64_t class_dim, int64_t reduction, int64_t ignore_index, std::string_view group,
                                    int64_t vocab_size) {
  auto r = hp::vocab_parallel_nll_loss_forward(logp, class_dim, target, defined_or_none(weight), reduction,
                                               ignore_index, communicator(group).get(), vocab_size);
  return {r[0], r[1]};
}

Tensor nll_loss_backward(const Tensor& grad, const Tensor& logp, const Tensor& target, const OptTensor& weight,
                         const Tensor& total_weight, int64_t class_dim, int64_t reduction, int64_t ignore_index,
                         std::string_view group, int64_t vocab_size) {
  return hp::vocab_parallel_nll_loss_backward(grad, logp, class_dim, target, defined_or_none(weight), reduction,
                                              ignore_index, total_weight, communicator(group).get(), vocab_size);
}

struct NllLossFunction : torch::autograd::Function<NllLossFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& logp, const Tensor& target, const OptTensor& weight,
                               int64_t class_dim, int64_t reduction, int64_t ignore_index, std::string_view group,
                               int64_t vocab_size) {
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = op_handle<decltype(nll_loss)>("hyper_parallel_cpp::vocab_parallel_nll_loss");
    auto [out, total_weight] = op.call(logp, target, weight, class_dim, reduction, ignore_index, group, vocab_size);
    ctx->save_for_backward({logp, target, or_undefined(weight), total_weight});
    ctx->saved_data["group"] = std::string(group);
    ctx->saved_data["ints"] = std::vector<int64_t>{class_dim, reduction, ignore_index, vocab_size};
    ctx->mark_non_differentiable({total_weight});
    return {out, total_weight};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        op_handle<decltype(nll_loss_backward)>("hyper_parallel_cpp::vocab_parallel_nll_loss_backward");
    const variable_list s = ctx->get_saved_variables();
    const auto ints = ctx->saved_data["ints"].toIntVector();
    Tensor grad = op.call(grads[0], s[0], s[1], s[2].defined() ? OptTensor(s[2]) : std::nullopt, s[3], ints[0], ints[1],
                          ints[2], ctx->saved_data["group"].toStringRef(), ints[3]);
    return input_gradients(8, {grad});
  }
};

std::tuple<Tensor, Tensor> nll_loss_autograd(const Tensor& logp, const Tensor& target, const OptTensor& weight,
                                             int64_t class_dim, int64_t reduction, int64_t ignore_index,
                                             std::string_view group, int64_t vocab_size) {
  const variable_list out =
      NllLossFunction::apply(logp, target, weight, class_dim, reduction, ignore_index, group, vocab_size);
  return {out[0], out[1]};
}

// --- fused linear + cross-entropy ------------------------------------------------------------

using LinearOutputs = std::tuple<Tensor, Tensor, Tensor, Tensor>;

LinearOutputs linear_cross_entropy(const Tensor& hidden, const Tensor& local_weight, const Tensor& target,
                                   const OptTensor& weight, std::string_view group, int64_t vocab_size,
                                   int64_t ignore_index, int64_t reduction, double label_smoothing,
                                   double z_loss_weight, double logit_softcap) {
  hp::VocabCrossEntropySaved saved;
  const Tensor loss = hp::vocab_parallel_linear_cross_entropy_forward(
      hidden, local_weight, target, communicator(group).get(), vocab_size,
      linear_options(weight, ignore_index, reduction, label_smoothing, z_loss_weight, logit_softcap), &saved);
  return {loss, saved.row_max, saved.log_sum, vocab_tensor(saved.vocab_size)};
}

std::tuple<Tensor, Tensor> linear_cross_entropy_backward(
    const Tensor& grad, const Tensor& hidden, const Tensor& local_weight, const Tensor& target, const OptTensor& weight,
    const Tensor& row_max, const Tensor& log_sum, const Tensor& vocab_size, std::string_view group,
    int64_t ignore_index, int64_t reduction, double label_smoothing, double z_loss_weight, double logit_softcap) {
  const hp::VocabCrossEntropySaved saved{row_max, log_sum, Tensor(), Tensor()};
  auto g = hp::vocab_parallel_linear_cross_entropy_backward(
      grad, hidden, local_weight, target, saved, communicator(group).get(), vocab_size.item<int64_t>(),
      linear_options(weight, ignore_index, reduction, label_smoothing, z_loss_weight, logit_softcap), true, true);
  return {g[0], g[1]};
}

struct LinearCrossEntropyFunction : torch::autograd::Function<LinearCrossEntropyFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& hidden, const Tensor& local_weight,
                               const Tensor& target, const OptTensor& weight, std::string_view group,
                               int64_t vocab_size, int64_t ignore_index, int64_t reduction, double label_smoothing,
                               double z_loss_weight, double logit_softcap) {
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = op_handle<decltype(linear_cross_entropy)>("hyper_parallel_cpp::fused_linear_cross_entropy");
    auto [loss, row_max, log_sum, vocab] =
        op.call(hidden, local_weight, target, weight, group, vocab_size, ignore_index, reduction, label_smoothing,
                z_loss_weight, logit_softcap);
    ctx->save_for_backward({hidden, local_weight, target, or_undefined(weight), row_max, log_sum, vocab});
    ctx->saved_data["group"] = std::string(group);
    ctx->saved_data["ints"] = std::vector<int64_t>{ignore_index, reduction};
    ctx->saved_data["floats"] = std::vector<double>{label_smoothing, z_loss_weight, logit_softcap};
    ctx->mark_non_differentiable({row_max, log_sum, vocab});
    return {loss, row_max, log_sum, vocab};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        op_handle<decltype(linear_cross_entropy_backward)>("hyper_parallel_cpp::fused_linear_cross_entropy_backward");
    const variable_list s = ctx->get_saved_variables();
    const auto ints = ctx->saved_data["ints"].toIntVector();
    const auto floats = ctx->saved_data["floats"].toDoubleVector();
    auto [gh, gw] =
        op.call(grads[0], s[0], s[1], s[2], s[3].defined() ? OptTensor(s[3]) : std::nullopt, s[4], s[5], s[6],
                ctx->saved_data["group"].toStringRef(), ints[0], ints[1], floats[0], floats[1], floats[2]);
    return input_gradients(11, {ctx->needs_input_grad(0) ? gh : Tensor(), ctx->needs_input_grad(1) ? gw : Tensor()});
  }
};

LinearOutputs linear_cross_entropy_autograd(const Tensor& hidden, const Tensor& local_weight, const Tensor& target,
                                            const OptTensor& weight, std::string_view group, int64_t vocab_size,
                                            int64_t ignore_index, int64_t reduction, double label_smoothing,
                                            double z_loss_weight, double logit_softcap) {
  const variable_list out =
      LinearCrossEntropyFunction::apply(hidden, local_weight, target, weight, group, vocab_size, ignore_index,
                                        reduction, label_smoothing, z_loss_weight, logit_softcap);
  return {out[0], out[1], out[2], out[3]};
}

// --- log-probabilities and entropy ----------------------------------------------------------

using LogprobsOutputs = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

// Beside the results: what backward keeps, the entropy's mean difference (LogprobsSaved; empty
// without the entropy, which tells backward that forward computed none). A forward's outputs
// may not alias one another.
LogprobsOutputs logprobs_outputs(const hp::Logprobs& out, const hp::LogprobsSaved& saved) {
  const Tensor entropy = or_empty(out.entropy, saved.row_max);
  Tensor kept = or_empty(saved.mean_difference, saved.row_max);
  if (kept.is_alias_of(entropy)) kept = kept.clone();
  return {out.logprobs, entropy, saved.row_max, saved.log_sum, kept, vocab_tensor(saved.vocab_size)};
}

hp::LogprobsSaved logprobs_saved(const Tensor& row_max, const Tensor& log_sum, const Tensor& mean_difference,
                                 int64_t vocab_size) {
  return {row_max, log_sum, mean_difference.numel() ? mean_difference : Tensor(), vocab_size};
}

LogprobsOutputs logprobs(const Tensor& logits, const Tensor& target, std::string_view group, int64_t vocab_size,
                         int64_t class_dim, double temperature, bool return_entropy, int64_t ignore_index) {
  hp::LogprobsSaved saved;
  const hp::Logprobs out =
      hp::vocab_parallel_logprobs_forward(logits, class_dim, target, communicator(group).get(), vocab_size,
                                          logprobs_options(temperature, return_entropy, ignore_index), &saved);
  return logprobs_outputs(out, saved);
}

Tensor logprobs_backward(const OptTensor& grad_logprobs, const OptTensor& grad_entropy, const Tensor& logits,
                         const Tensor& target, const Tensor& row_max, const Tensor& log_sum,
                         const Tensor& mean_difference, const Tensor& vocab_size, std::string_view group,
                         int64_t class_dim, double temperature, int64_t ignore_index) {
  const int64_t vocab = vocab_size.item<int64_t>();
  return hp::vocab_parallel_logprobs_backward(
      or_undefined(grad_logprobs), or_undefined(grad_entropy), logits, class_dim, target,
      logprobs_saved(row_max, log_sum, mean_difference, vocab), communicator(group).get(), vocab,
      logprobs_options(temperature, mean_difference.numel() > 0, ignore_index));
}

// The incoming gradient of the entropy output, when the forward computed one.
OptTensor entropy_gradient(const variable_list& grads, const Tensor& kept_mean_difference) {
  return kept_mean_difference.numel() > 0 && grads[1].defined() ? OptTensor(grads[1]) : std::nullopt;
}

struct LogprobsFunction : torch::autograd::Function<LogprobsFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& logits, const Tensor& target, std::string_view group,
                               int64_t vocab_size, int64_t class_dim, double temperature, bool return_entropy,
                               int64_t ignore_index) {
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = op_handle<decltype(logprobs)>("hyper_parallel_cpp::vocab_parallel_logprobs");
    auto [lp, entropy, row_max, log_sum, kept, vocab] =
        op.call(logits, target, group, vocab_size, class_dim, temperature, return_entropy, ignore_index);
    ctx->save_for_backward({logits, target, row_max, log_sum, kept, vocab});
    ctx->saved_data["group"] = std::string(group);
    ctx->saved_data["ints"] = std::vector<int64_t>{class_dim, ignore_index};
    ctx->saved_data["temperature"] = temperature;
    ctx->mark_non_differentiable({row_max, log_sum, kept, vocab});
    return {lp, entropy, row_max, log_sum, kept, vocab};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    Tensor grad;
    if (ctx->needs_input_grad(0)) {
      static const auto op =
          op_handle<decltype(logprobs_backward)>("hyper_parallel_cpp::vocab_parallel_logprobs_backward");
      const auto ints = ctx->saved_data["ints"].toIntVector();
      grad = op.call(grads[0].defined() ? OptTensor(grads[0]) : std::nullopt, entropy_gradient(grads, s[4]), s[0], s[1],
                     s[2], s[3], s[4], s[5], ctx->saved_data["group"].toStringRef(), ints[0],
                     ctx->saved_data["temperature"].toDouble(), ints[1]);
    }
    return input_gradients(8, {grad});
  }
};

LogprobsOutputs logprobs_autograd(const Tensor& logits, const Tensor& target, std::string_view group,
                                  int64_t vocab_size, int64_t class_dim, double temperature, bool return_entropy,
                                  int64_t ignore_index) {
  const variable_list out =
      LogprobsFunction::apply(logits, target, group, vocab_size, class_dim, temperature, return_entropy, ignore_index);
  return {out[0], out[1], out[2], out[3], out[4], out[5]};
}

LogprobsOutputs linear_logprobs(const Tensor& hidden, const Tensor& local_weight, const Tensor& target,
                                std::string_view group, int64_t vocab_size, double temperature, bool return_entropy,
                                int64_t ignore_index) {
  hp::LogprobsSaved saved;
  const hp::Logprobs out =
      hp::vocab_parallel_linear_logprobs_forward(hidden, local_weight, target, communicator(group).get(), vocab_size,
                                                 logprobs_options(temperature, return_entropy, ignore_index), &saved);
  return logprobs_outputs(out, saved);
}

std::tuple<Tensor, Tensor> linear_logprobs_backward(const OptTensor& grad_logprobs, const OptTensor& grad_entropy,
                                                    const Tensor& hidden, const Tensor& local_weight,
                                                    const Tensor& target, const Tensor& row_max, const Tensor& log_sum,
                                                    const Tensor& mean_difference, const Tensor& vocab_size,
                                                    std::string_view group, double temperature, int64_t ignore_index) {
  const int64_t vocab = vocab_size.item<int64_t>();
  auto g = hp::vocab_parallel_linear_logprobs_backward(
      or_undefined(grad_logprobs), or_undefined(grad_entropy), hidden, local_weight, target,
      logprobs_saved(row_max, log_sum, mean_difference, vocab), communicator(group).get(), vocab,
      logprobs_options(temperature, mean_difference.numel() > 0, ignore_index), true, true);
  return {g[0], g[1]};
}

struct LinearLogprobsFunction : torch::autograd::Function<LinearLogprobsFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& hidden, const Tensor& local_weight,
                               const Tensor& target, std::string_view group, int64_t vocab_size, double temperature,
                               bool return_entropy, int64_t ignore_index) {
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = op_handle<decltype(linear_logprobs)>("hyper_parallel_cpp::fused_linear_logprobs");
    auto [lp, entropy, row_max, log_sum, kept, vocab] =
        op.call(hidden, local_weight, target, group, vocab_size, temperature, return_entropy, ignore_index);
    ctx->save_for_backward({hidden, local_weight, target, row_max, log_sum, kept, vocab});
    ctx->saved_data["group"] = std::string(group);
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["temperature"] = temperature;
    ctx->mark_non_differentiable({row_max, log_sum, kept, vocab});
    return {lp, entropy, row_max, log_sum, kept, vocab};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        op_handle<decltype(linear_logprobs_backward)>("hyper_parallel_cpp::fused_linear_logprobs_backward");
    const variable_list s = ctx->get_saved_variables();
    auto [gh, gw] = op.call(grads[0].defined() ? OptTensor(grads[0]) : std::nullopt, entropy_gradient(grads, s[5]),
                            s[0], s[1], s[2], s[3], s[4], s[5], s[6], ctx->saved_data["group"].toStringRef(),
                            ctx->saved_data["temperature"].toDouble(), ctx->saved_data["ignore_index"].toInt());
    return input_gradients(8, {ctx->needs_input_grad(0) ? gh : Tensor(), ctx->needs_input_grad(1) ? gw : Tensor()});
  }
};

LogprobsOutputs linear_logprobs_autograd(const Tensor& hidden, const Tensor& local_weight, const Tensor& target,
                                         std::string_view group, int64_t vocab_size, double temperature,
                                         bool return_entropy, int64_t ignore_index) {
  const variable_list out = LinearLogprobsFunction::apply(hidden, local_weight, target, group, vocab_size, temperature,
                                                          return_entropy, ignore_index);
  return {out[0], out[1], out[2], out[3], out[4], out[5]};
}

}  // namespace

TORCH_LIBRARY(hyper_parallel_cpp, m) {
  m.def(
      "vocab_parallel_cross_entropy(Tensor logits, Tensor target, Tensor? weight, str group_name, int vocab_size, "
      "int class_dim, int ignore_index, int reduction, float label_smoothing, float z_loss_weight, "
      "float logit_softcap) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "vocab_parallel_cross_entropy_backward(Tensor grad, Tensor logits, Tensor target, Tensor? weight, "
      "Tensor row_max, Tensor log_sum, Tensor row_weight, Tensor vocab_size, str group_name, int class_dim, "
      "int ignore_index, int reduction, float label_smoothing, float z_loss_weight, float logit_softcap) -> Tensor");
  m.def("vocab_parallel_log_softmax(Tensor local, int class_dim, str group_name, int vocab_size) -> Tensor");
  m.def(
      "vocab_parallel_log_softmax_backward(Tensor grad, Tensor output, int class_dim, str group_name, "
      "int vocab_size) -> Tensor");
  m.def(
      "vocab_parallel_nll_loss(Tensor logp, Tensor target, Tensor? weight, int class_dim, int reduction, "
      "int ignore_index, str group_name, int vocab_size) -> (Tensor, Tensor)");
  m.def(
      "vocab_parallel_nll_loss_backward(Tensor grad, Tensor logp, Tensor target, Tensor? weight, "
      "Tensor total_weight, int class_dim, int reduction, int ignore_index, str group_name, int vocab_size) "
      "-> Tensor");
  m.def(
      "fused_linear_cross_entropy(Tensor hidden, Tensor local_weight, Tensor target, Tensor? weight, "
      "str group_name, int vocab_size, int ignore_index, int reduction, float label_smoothing, "
      "float z_loss_weight, float logit_softcap) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "fused_linear_cross_entropy_backward(Tensor grad, Tensor hidden, Tensor local_weight, Tensor target, "
      "Tensor? weight, Tensor row_max, Tensor log_sum, Tensor vocab_size, str group_name, int ignore_index, "
      "int reduction, float label_smoothing, float z_loss_weight, float logit_softcap) -> (Tensor, Tensor)");
  m.def(
      "vocab_parallel_logprobs(Tensor logits, Tensor target, str group_name, int vocab_size, int class_dim, "
      "float temperature, bool return_entropy, int ignore_index) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "vocab_parallel_logprobs_backward(Tensor? grad_logprobs, Tensor? grad_entropy, Tensor logits, "
      "Tensor target, Tensor row_max, Tensor log_sum, Tensor mean_difference, Tensor vocab_size, str group_name, "
      "int class_dim, float temperature, int ignore_index) -> Tensor");
  m.def(
      "fused_linear_logprobs(Tensor hidden, Tensor local_weight, Tensor target, str group_name, int vocab_size, "
      "float temperature, bool return_entropy, int ignore_index) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "fused_linear_logprobs_backward(Tensor? grad_logprobs, Tensor? grad_entropy, Tensor hidden, "
      "Tensor local_weight, Tensor target, Tensor row_max, Tensor log_sum, Tensor mean_difference, Tensor vocab_size, "
      "str group_name, float temperature, int ignore_index) -> (Tensor, Tensor)");
}

// The kernels, for CPU and CUDA tensors alike (the library picks the device's kernel). Not
// CompositeExplicitAutograd: that would cover the Meta key too, where the fake kernels live.
#define HP_REGISTER_KERNELS(m)                                                                              \
  m.impl("vocab_parallel_cross_entropy", &RaisingPythonErrors<cross_entropy>::call);                        \
  m.impl("vocab_parallel_cross_entropy_backward", &RaisingPythonErrors<cross_entropy_backward>::call);      \
  m.impl("vocab_parallel_log_softmax", &RaisingPythonErrors<log_softmax>::call);                            \
  m.impl("vocab_parallel_log_softmax_backward", &RaisingPythonErrors<log_softmax_backward>::call);          \
  m.impl("vocab_parallel_nll_loss", &RaisingPythonErrors<nll_loss>::call);                                  \
  m.impl("vocab_parallel_nll_loss_backward", &RaisingPythonErrors<nll_loss_backward>::call);                \
  m.impl("fused_linear_cross_entropy", &RaisingPythonErrors<linear_cross_entropy>::call);                   \
  m.impl("fused_linear_cross_entropy_backward", &RaisingPythonErrors<linear_cross_entropy_backward>::call); \
  m.impl("vocab_parallel_logprobs", &RaisingPythonErrors<logprobs>::call);                                  \
  m.impl("vocab_parallel_logprobs_backward", &RaisingPythonErrors<logprobs_backward>::call);                \
  m.impl("fused_linear_logprobs", &RaisingPythonErrors<linear_logprobs>::call);                             \
  m.impl("fused_linear_logprobs_backward", &RaisingPythonErrors<linear_logprobs_backward>::call)

TORCH_LIBRARY_IMPL(hyper_parallel_cpp, CPU, m) { HP_REGISTER_KERNELS(m); }
TORCH_LIBRARY_IMPL(hyper_parallel_cpp, CUDA, m) { HP_REGISTER_KERNELS(m); }
#undef HP_REGISTER_KERNELS

TORCH_LIBRARY_IMPL(hyper_parallel_cpp, Autograd, m) {
  m.impl("vocab_parallel_cross_entropy", cross_entropy_autograd);
  m.impl("vocab_parallel_log_softmax", log_softmax_autograd);
  m.impl("vocab_parallel_nll_loss", nll_loss_autograd);
  m.impl("fused_linear_cross_entropy", linear_cross_entropy_autograd);
  m.impl("vocab_parallel_logprobs", logprobs_autograd);
  m.impl("fused_linear_logprobs", linear_logprobs_autograd);
}

}  // namespace hyper_parallel_python
