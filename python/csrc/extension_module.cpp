// hyper_parallel_cpp._C: the C++ library's vocabulary-parallel kernels (hyper_parallel/loss/vocab_parallel.h)
// for the Python package, over the process groups of torch.distributed. Only bindings live
// here: every kernel is the library's, the same the C++ loss_parallel runs. The package's
// torch.library ops are registered beside them (library_ops.cpp); these functions serve
// what the ops do not: loss_parallel()'s route on PyTorch's DTensor (a registered op runs below any
// dispatch mode, so CommDebugMode would not see the collectives these issue), its gradient written
// in forward, the cross-entropy-only options' refusal on every rank, configuration and counters.
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>

#include "group_communicator.h"
#include "hyper_parallel/loss/gradient_buffers.h"
#include "hyper_parallel/loss/loss_parallel.h"
#include "hyper_parallel/loss/parallelism_config.h"

namespace py = pybind11;
namespace hp = hyper_parallel;

namespace {

using namespace hyper_parallel_python;

// The C++ loss_parallel guard with the Python context's cross-entropy-only options, engaged
// only when one is set (empty otherwise: the record then holds the defaults).
std::optional<hp::LossParallelGuard> cross_entropy_only_guard(double z_loss_weight, double logit_softcap) {
  std::optional<hp::LossParallelGuard> guard;
  if (z_loss_weight == 0 && logit_softcap == 0) return guard;
  hp::LossParallelOptions o;
  o.z_loss_weight = z_loss_weight;
  o.logit_softcap = logit_softcap;
  guard.emplace(o);
  return guard;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "HyperParallel's C++ kernels (the hyper_parallel_cpp package calls these; use its Python API)";

  // The library's errors, as the Python classes the spec names (their bases: ValueError and
  // NotImplementedError); c10's typed errors as the Python types PyTorch raises for them.
  auto& layout_error =
      py::register_local_exception<hp::LossParallelLayoutError>(m, "LossParallelLayoutError", PyExc_ValueError);
  auto& unsupported_error = py::register_local_exception<hp::LossParallelUnsupportedError>(
      m, "LossParallelUnsupportedError", PyExc_NotImplementedError);
  error_types() = {layout_error.ptr(), unsupported_error.ptr()};
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });

  m.def(
      "cross_entropy_forward",
      [](const at::Tensor& logits, int64_t class_dim, const at::Tensor& target, const std::optional<at::Tensor>& weight,
         const std::string& group, int64_t vocab_size, int64_t ignore_index, int64_t reduction, double label_smoothing,
         double z_loss_weight, double logit_softcap, bool gradient_in_forward, bool return_vocab) -> py::tuple {
        hp::VocabCrossEntropySaved saved;
        at::Tensor loss;
        {
          py::gil_scoped_release no_gil;
          hp::VocabCrossEntropyOptions o =
              ce_options(ignore_index, reduction, label_smoothing, z_loss_weight, logit_softcap);
          o.gradient_in_forward = gradient_in_forward;
          loss = hp::vocab_parallel_cross_entropy_forward(logits, class_dim, target, defined_or_none(weight),
                                                          communicator(group).get(), vocab_size, o, &saved);
        }
        // Probability targets only have a row weight to keep; an empty one stands for none.
        at::Tensor row_weight = saved.row_weight.defined() ? saved.row_weight : saved.row_max.new_empty({0});
        // The gradient written over the logits (gradient_in_forward), or an empty tensor.
        at::Tensor grad_rows = saved.grad_rows.defined() ? saved.grad_rows : saved.row_max.new_empty({0});
        // What 'mean' divides this member's rows by: a global mean sums it over the mesh dims
        // that shard the rows, so no front end restates the kernel's denominator.
        if (return_vocab)
          return py::make_tuple(loss, saved.row_max, saved.log_sum, row_weight, grad_rows, saved.mean_denominator,
                                saved.vocab_size);
        return py::make_tuple(loss, saved.row_max, saved.log_sum, row_weight, grad_rows, saved.mean_denominator);
      },
      py::arg("logits"), py::arg("class_dim"), py::arg("target"), py::arg("weight"), py::arg("group"),
      py::arg("vocab_size"), py::arg("ignore_index"), py::arg("reduction"), py::arg("label_smoothing"),
      py::arg("z_loss_weight"), py::arg("logit_softcap"), py::arg("gradient_in_forward"),
      py::arg("return_vocab") = false,
      "loss, row_max, log_sum, row_weight, grad_rows, mean_denominator (and with return_vocab the vocabulary it used: "
      "a vocab_size < 0 is learnt in the call's record, no collective of its own): the loss, what its backward needs "
      "and what 'mean' divides this member's rows by");
  m.def(
      "cross_entropy_backward",
      [](const at::Tensor& grad, const at::Tensor& logits, int64_t class_dim, const at::Tensor& target,
         const std::optional<at::Tensor>& weight, const at::Tensor& row_max, const at::Tensor& log_sum,
         const at::Tensor& row_weight, const at::Tensor& grad_rows, const std::string& group, int64_t vocab_size,
         int64_t ignore_index, int64_t reduction, double label_smoothing, double z_loss_weight, double logit_softcap) {
        py::gil_scoped_release no_gil;
        hp::VocabCrossEntropySaved saved{row_max, log_sum, row_weight.numel() ? row_weight : at::Tensor(),
                                         grad_rows.numel() ? grad_rows : at::Tensor()};
        return hp::vocab_parallel_cross_entropy_backward(
            grad, logits, class_dim, target, defined_or_none(weight), saved, communicator(group).get(), vocab_size,
            ce_options(ignore_index, reduction, label_smoothing, z_loss_weight, logit_softcap));
      });
  m.def(
      "vocab_size",
      [](int64_t local_classes, const std::string& group, const std::string& op, const at::Tensor& like) {
        py::gil_scoped_release no_gil;
        return hp::learn_vocab_size(op, local_classes, communicator(group).get(), like.device());
      },
      py::arg("local_classes"), py::arg("group"), py::arg("op"), py::arg("like"),
      "The vocabulary the members' torch.chunk pieces make up, learnt in a call record of `op` on `like`'s "
      "device (one small all-gather: the first collective `op` makes when given the vocabulary)");
  m.def(
      "agree_on_loss_strictness",
      [](const std::string& op, bool strict, const std::vector<std::string>& groups, const at::Tensor& like) {
        py::gil_scoped_release no_gil;
        std::vector<std::unique_ptr<hp::Communicator>> held;
        std::vector<const hp::Communicator*> comms;
        for (const std::string& g : groups) {
          held.push_back(communicator(g));
          comms.push_back(held.back().get());
        }
        hp::agree_on_loss_strictness(op, strict, comms, like.device());
      },
      py::arg("op"), py::arg("strict"), py::arg("groups"), py::arg("like"),
      "Before a decision taken from loss_parallel's strictness alone (refusing a layout, gathering other mesh "
      "dims): the members of `groups` agree on `op` and `strict`, or every member raises the same "
      "LossParallelLayoutError. One group: the call's record (the first collective of members that go on into "
      "`op`); several: one small all-gather per group");
  m.def(
      "agree_outside_loss_parallel",
      [](const std::string& op, const std::string& group, const at::Tensor& like) {
        py::gil_scoped_release no_gil;
        hp::agree_outside_loss_parallel(op, communicator(group).get(), like.device());
      },
      py::arg("op"), py::arg("group"), py::arg("like"),
      "For a loss on class-sharded logits called outside loss_parallel(), before its refusal or fallback: the "
      "record of `op` on the classes' group, saying 'outside', so that a context entered on some ranks only is "
      "the same LossParallelLayoutError on every rank (one small all-gather)");
  // guard_z_loss_weight / guard_logit_softcap: the Python loss_parallel context's cross-entropy-only
  // options, set by its log_softmax and nll_loss routes. Non-zero, they open the C++ guard for the
  // call, whose record then carries them: compared between ranks, then refused on every rank.
  m.def(
      "log_softmax",
      [](const at::Tensor& local, int64_t class_dim, const std::string& group, int64_t vocab_size,
         std::optional<at::ScalarType> dtype, double guard_z_loss_weight, double guard_logit_softcap) {
        py::gil_scoped_release no_gil;
        const auto guard = cross_entropy_only_guard(guard_z_loss_weight, guard_logit_softcap);
        return hp::vocab_parallel_log_softmax(local, class_dim, communicator(group).get(), vocab_size, dtype);
      },
      py::arg("local"), py::arg("class_dim"), py::arg("group"), py::arg("vocab_size"), py::arg("dtype"),
      py::arg("guard_z_loss_weight") = 0.0, py::arg("guard_logit_softcap") = 0.0);
  m.def(
      "log_softmax_backward",
      [](const at::Tensor& grad, const at::Tensor& output, int64_t class_dim, const std::string& group,
         int64_t vocab_size) {
        py::gil_scoped_release no_gil;
        return hp::vocab_parallel_log_softmax_backward(grad, output, class_dim, communicator(group).get(), vocab_size,
                                                       output.scalar_type());
      },
      py::arg("grad"), py::arg("output"), py::arg("class_dim"), py::arg("group"), py::arg("vocab_size"));
  m.def(
      "nll_loss_forward",
      [](const at::Tensor& logp, int64_t class_dim, const at::Tensor& target, const std::optional<at::Tensor>& weight,
         int64_t reduction, int64_t ignore_index, const std::string& group, int64_t vocab_size,
         double guard_z_loss_weight, double guard_logit_softcap) {
        py::gil_scoped_release no_gil;
        const auto guard = cross_entropy_only_guard(guard_z_loss_weight, guard_logit_softcap);
        auto r = hp::vocab_parallel_nll_loss_forward(logp, class_dim, target, defined_or_none(weight), reduction,
                                                     ignore_index, communicator(group).get(), vocab_size);
        return std::make_tuple(r[0], r[1]);
      },
      py::arg("logp"), py::arg("class_dim"), py::arg("target"), py::arg("weight"), py::arg("reduction"),
      py::arg("ignore_index"), py::arg("group"), py::arg("vocab_size"), py::arg("guard_z_loss_weight") = 0.0,
      py::arg("guard_logit_softcap") = 0.0);
  // The process-wide configuration the C++ side reads (parallelism_config.h has the precedence).
  m.def("parallelism_config", [] {
    const hp::ParallelismConfig c = hp::parallelism_config();
    return std::make_tuple(c.disable_loss_parallel, c.loss_parallel_strict_mesh,
                           c.loss_parallel_fallback_on_layout_error);
  });
  m.def("set_parallelism_config", [](bool disable, bool strict_mesh, bool fallback) {
    hp::ParallelismConfig c = hp::parallelism_config();
    c.disable_loss_parallel = disable;
    c.loss_parallel_strict_mesh = strict_mesh;
    c.loss_parallel_fallback_on_layout_error = fallback;
    hp::set_parallelism_config(c);
  });

  // Collectives our kernels issued on the calling thread (tests assert the budgets).
  m.def("collective_counts", [] {
    const hp::CollectiveCounts c = hp::collective_counts();
    return py::dict(py::arg("all_reduce") = c.all_reduce, py::arg("all_gather") = c.all_gather,
                    py::arg("reduce_scatter") = c.reduce_scatter, py::arg("broadcast") = c.broadcast,
                    py::arg("all_to_all") = c.all_to_all, py::arg("barrier") = c.barrier,
                    py::arg("scatter") = c.scatter);
  });
  m.def("reset_collective_counts", [] { hp::reset_collective_counts(); });

  // The logits-sized gradient buffer the calling thread keeps between steps (hyper_parallel/loss/gradient_buffers.h):
  // the benchmark counts it as the loss's memory, as hp-bench does.
  m.def("cached_gradient_buffer_bytes", &hp::cached_gradient_buffer_bytes);
  m.def("release_gradient_buffers", &hp::release_gradient_buffers);
}
