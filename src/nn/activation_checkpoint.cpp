#include "hyper_parallel/nn/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/nn/module.h>

#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_set>

#include "compat/autograd_compat.h"
#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/dtensor/dtensor.h"

namespace hyper_parallel {

namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

// The random sources a function may draw from: LibTorch's default generator of the CPU and
// of every other device its tensors are on, and the DTensor random sequence of every mesh
// they live on.
class RandomSources {
 public:
  struct Position {
    std::vector<at::Tensor> generator_states;
    std::vector<uint64_t> mesh_ops_drawn;
  };

  RandomSources(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& parameters) {
    add_generator(at::detail::getDefaultCPUGenerator(), "the default CPU generator");
    std::unordered_set<uint64_t> meshes_seen;
    for (const auto* list : {&inputs, &parameters}) {
      for (const at::Tensor& t : *list) {
        if (!t.defined()) continue;
        const c10::Device device = t.device();
        if (device.type() != at::kCPU && device.type() != at::kMeta) {
          const std::string name = "the default generator of " + device.str();
          bool seen = false;
          for (const auto& n : generator_names_) seen |= n == name;
          if (!seen) add_generator(at::globalContext().defaultGenerator(device), name);
        }
        if (is_dtensor(t)) {
          const DeviceMesh& mesh = mesh_of(t);
          if (meshes_seen.insert(mesh.uid()).second) meshes_.push_back(mesh);
        }
      }
    }
  }

  Position position() const {
    Position p;
    for (at::Generator g : generators_) {
      std::lock_guard<std::mutex> lock(g.mutex());
      p.generator_states.push_back(g.get_state());
    }
    for (const DeviceMesh& m : meshes_) p.mesh_ops_drawn.push_back(m.random_ops_drawn());
    return p;
  }

  void restore(const Position& p) const {
    for (size_t i = 0; i < generators_.size(); ++i) {
      at::Generator g = generators_[i];
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(p.generator_states[i]);
    }
    for (size_t i = 0; i < meshes_.size(); ++i) meshes_[i].rewind_random_ops(p.mesh_ops_drawn[i]);
  }

  // The sources that moved between two positions, as a list for a message; empty: none.
  std::string moved(const Position& a, const Position& b) const {
    std::string out;
    auto add = [&](const std::string& what) { out += (out.empty() ? "" : ", ") + what; };
    for (size_t i = 0; i < generators_.size(); ++i) {
      if (!at::equal(a.generator_states[i], b.generator_states[i])) add(generator_names_[i]);
    }
    for (size_t i = 0; i < meshes_.size(); ++i) {
      if (a.mesh_ops_drawn[i] != b.mesh_ops_drawn[i]) add("the DTensor random sequence of " + meshes_[i].str());
    }
    return out;
  }

 private:
  void add_generator(at::Generator g, std::string name) {
    generators_.push_back(std::move(g));
    generator_names_.push_back(std::move(name));
  }

  std::vector<at::Generator> generators_;
  std::vector<std::string> generator_names_;
  std::vector<DeviceMesh> meshes_;
};

// For the recompute: the random sources as they were before the forward, then, on leaving,
// as they are now (what was drawn since the forward stays drawn).
class ReplayRandomNumbers {
 public:
  ReplayRandomNumbers(const RandomSources& sources, const RandomSources::Position& before_forward)
      : sources_(sources), now_(sources.position()) {
    sources_.restore(before_forward);
  }
  ~ReplayRandomNumbers() { sources_.restore(now_); }
  ReplayRandomNumbers(const ReplayRandomNumbers&) = delete;
  ReplayRandomNumbers& operator=(const ReplayRandomNumbers&) = delete;

 private:
  const RandomSources& sources_;
  RandomSources::Position now_;
};

struct OutputMetadata {
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
  int64_t slot = -1;  // its input number in the node; -1: not differentiable
};

std::string describe(const at::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + " " + c10::str(t.sizes()) + (is_dtensor(t) ? " DTensor" : "");
}

bool is_differentiable(const at::Tensor& t) {
  return t.defined() && (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()));
}

// The node that stands for the checkpointed function: edges to its inputs, then to its
// parameters.
struct CheckpointBackward : Node {
  CheckpointedFunction function;
  std::vector<torch::autograd::SavedVariable> saved_inputs;
  std::vector<bool> input_requires_grad;
  std::vector<at::Tensor> parameters;
  std::vector<OutputMetadata> outputs;
  std::optional<RandomSources> random_sources;  // set when the forward drew random numbers
  RandomSources::Position before_forward;

  variable_list apply(variable_list&& grads) override;
  std::string name() const override { return "hyper_parallel::CheckpointBackward"; }
  void release_variables() override {
    for (auto& s : saved_inputs) s.reset_data();
    function = nullptr;
    parameters.clear();
    random_sources.reset();
  }

  std::vector<at::Tensor> recompute(const std::vector<at::Tensor>& inputs) const;
  void check_recomputed(const std::vector<at::Tensor>& recomputed) const;
  void check_reads_nothing_unlisted(const std::vector<at::Tensor>& recomputed, const std::vector<at::Tensor>& inputs,
                                    uint64_t first_sequence_nr) const;
};

std::vector<at::Tensor> CheckpointBackward::recompute(const std::vector<at::Tensor>& inputs) const {
  at::AutoGradMode grad_enabled(true);
  std::optional<ReplayRandomNumbers> replay;
  if (random_sources) replay.emplace(*random_sources, before_forward);
  return function(inputs);
}

void CheckpointBackward::check_recomputed(const std::vector<at::Tensor>& recomputed) const {
  bool same = recomputed.size() == outputs.size();
  for (size_t k = 0; same && k < outputs.size(); ++k) {
    const at::Tensor& r = recomputed[k];
    same = r.defined() && r.sizes().vec() == outputs[k].sizes && r.scalar_type() == outputs[k].dtype;
  }
  if (same) return;
  std::string forward, again;
  for (const auto& o : outputs) {
    forward += (forward.empty() ? "" : ", ") + std::string(c10::toString(o.dtype)) + " " + c10::str(o.sizes);
  }
  for (const auto& r : recomputed) again += (again.empty() ? "" : ", ") + (r.defined() ? describe(r) : "undefined");
  throw std::runtime_error("checkpoint: the recompute in backward returned [" + again + "], the forward returned [" +
                           forward + "]; a checkpointed function must compute the same thing when run again");
}

// Walks the recomputed graph: every path must end at an input or a listed parameter. A
// tensor that requires grad and was read otherwise (captured) would get no gradient.
void CheckpointBackward::check_reads_nothing_unlisted(const std::vector<at::Tensor>& recomputed,
                                                      const std::vector<at::Tensor>& inputs,
                                                      uint64_t first_sequence_nr) const {
  std::unordered_set<const c10::TensorImpl*> listed;
  for (const auto* list : {&inputs, &parameters}) {
    for (const at::Tensor& t : *list) {
      if (t.defined()) listed.insert(t.unsafeGetTensorImpl());
    }
  }
  const uint64_t thread = at::RecordFunction::currentThreadId();
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> todo;
  for (const at::Tensor& r : recomputed) {
    if (r.defined() && r.grad_fn()) todo.push_back(r.grad_fn().get());
  }
  while (!todo.empty()) {
    const Node* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    if (const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(node)) {
      if (listed.count(acc->variable.unsafeGetTensorImpl())) continue;
      throw std::runtime_error("checkpoint: the function reads a tensor that requires grad (" +
                               describe(acc->variable) +
                               ") that is neither one of its inputs nor one of its parameters; its gradient would be "
                               "lost: pass it as an input or a parameter");
    }
    if (node->sequence_nr() < first_sequence_nr || node->thread_id() != thread) {
      throw std::runtime_error(
          "checkpoint: the function reads a tensor computed outside it that requires grad (its "
          "gradient node " +
          node->name() + " is not part of the recompute); pass it as an input");
    }
    for (const auto& e : node->next_edges()) {
      if (e.is_valid()) todo.push_back(e.function.get());
    }
  }
}

variable_list CheckpointBackward::apply(variable_list&& grads) {
  TORCH_CHECK(!torch::autograd::GradMode::is_enabled(),
              "checkpoint: backward with create_graph (a double backward) through a checkpointed function is not "
              "supported");
  const size_t n_inputs = saved_inputs.size();
  variable_list result(n_inputs + parameters.size());
  std::vector<size_t> wanted;
  for (size_t i = 0; i < result.size(); ++i) {
    if (task_should_compute_output(i)) wanted.push_back(i);
  }
  bool any_gradient = false;
  for (const at::Tensor& g : grads) any_gradient |= g.defined();
  if (wanted.empty() || !any_gradient) return result;

  std::vector<at::Tensor> inputs(n_inputs);
  for (size_t i = 0; i < n_inputs; ++i) {
    const at::Tensor saved = saved_inputs[i].unpack();  // raises if modified in place since
    if (!saved.defined()) continue;
    inputs[i] = saved.detach();
    if (input_requires_grad[i]) inputs[i].set_requires_grad(true);
  }
  const uint64_t first_sequence_nr = at::sequence_number::peek();
  const std::vector<at::Tensor> recomputed = recompute(inputs);
  check_recomputed(recomputed);
  check_reads_nothing_unlisted(recomputed, inputs, first_sequence_nr);

  variable_list roots, root_grads;
  for (size_t k = 0; k < recomputed.size(); ++k) {
    const int64_t slot = outputs[k].slot;
    if (slot < 0 || !grads[slot].defined() || !recomputed[k].requires_grad()) continue;
    roots.push_back(recomputed[k]);
    root_grads.push_back(grads[slot]);
  }
  if (roots.empty()) return result;
  variable_list targets;
  for (size_t i : wanted) targets.push_back(i < n_inputs ? inputs[i] : parameters[i - n_inputs]);
  const variable_list taken = torch::autograd::grad(roots, targets, root_grads, /*retain_graph=*/false,
                                                    /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t j = 0; j < wanted.size(); ++j) result[wanted[j]] = taken[j];
  return result;
}

bool any_requires_grad(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

// An output the node can own: not a view, not an alias of an input or parameter (whose
// gradient edge it would replace), not already in a graph.
at::Tensor own_output(const at::Tensor& out, const std::vector<at::Tensor>& inputs,
                      const std::vector<at::Tensor>& parameters) {
  bool alias = out.is_view() || out.requires_grad();
  for (const auto* list : {&inputs, &parameters}) {
    for (const at::Tensor& t : *list) alias |= t.defined() && t.unsafeGetTensorImpl() == out.unsafeGetTensorImpl();
  }
  if (!alias) return out;
  at::NoGradGuard no_grad;
  return out.clone();
}

}  // namespace

std::vector<at::Tensor> checkpoint(const CheckpointedFunction& function, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& parameters, const CheckpointOptions& options) {
  if (!torch::autograd::GradMode::is_enabled() || (!any_requires_grad(inputs) && !any_requires_grad(parameters))) {
    return function(inputs);
  }
  RandomSources sources(inputs, parameters);
  RandomSources::Position before = sources.position();
  std::vector<at::Tensor> outputs;
  {
    at::NoGradGuard no_grad;
    outputs = function(inputs);
  }
  const std::string drawn_from = sources.moved(before, sources.position());
  if (!drawn_from.empty() && !options.preserve_rng_state) {
    throw std::runtime_error("checkpoint: the function drew random numbers (from " + drawn_from +
                             ") in its forward and preserve_rng_state is false: its recompute in backward would draw "
                             "other ones and give wrong gradients; set preserve_rng_state "
                             "(activation_checkpoint.preserve_rng_state) or checkpoint nothing that draws");
  }
  compat::NodePtr owner = compat::make_node<CheckpointBackward>();
  auto* node = static_cast<CheckpointBackward*>(owner.get());
  node->function = function;
  for (const at::Tensor& x : inputs) {
    node->saved_inputs.emplace_back(x, /*is_output=*/false);
    node->input_requires_grad.push_back(x.defined() && x.requires_grad());
  }
  node->parameters = parameters;
  if (!drawn_from.empty()) {
    node->random_sources.emplace(std::move(sources));
    node->before_forward = std::move(before);
  }
  torch::autograd::edge_list edges = torch::autograd::collect_next_edges(inputs);
  for (auto& e : torch::autograd::collect_next_edges(parameters)) edges.push_back(std::move(e));
  node->set_next_edges(std::move(edges));
  for (at::Tensor& out : outputs) {
    OutputMetadata meta;
    if (out.defined()) {
      meta.sizes = out.sizes().vec();
      meta.dtype = out.scalar_type();
    }
    if (is_differentiable(out)) {
      out = own_output(out, inputs, parameters);
      meta.slot = static_cast<int64_t>(node->num_inputs());
      torch::autograd::create_gradient_edge(out, owner);
    }
    node->outputs.push_back(std::move(meta));
  }
  return outputs;
}

bool BlockCheckpointing::checkpoints(int64_t block) const {
  switch (mode) {
    case ActivationCheckpointMode::kNone:
      return false;
    case ActivationCheckpointMode::kFull:
      return true;
    case ActivationCheckpointMode::kSelective:
      return (block + 1) % every == 0;
  }
  return false;
}

std::string BlockCheckpointing::str() const {
  switch (mode) {
    case ActivationCheckpointMode::kNone:
      return "none";
    case ActivationCheckpointMode::kFull:
      return "full";
    case ActivationCheckpointMode::kSelective:
      return "selective (1 block in " + std::to_string(every) + ")";
  }
  return "?";
}

std::string BlockCheckpointing::str(int64_t blocks) const {
  if (mode == ActivationCheckpointMode::kNone) return "none";
  int64_t picked = 0;
  for (int64_t b = 0; b < blocks; ++b) picked += checkpoints(b) ? 1 : 0;
  const std::string of = " of " + std::to_string(blocks) + " blocks";
  if (mode == ActivationCheckpointMode::kFull) return "full (" + std::to_string(picked) + of + ")";
  const int64_t last = every % 100 / 10 == 1 ? 0 : every % 10;  // 11th, 12th, 13th
  const char* suffix = last == 1 ? "st" : last == 2 ? "nd" : last == 3 ? "rd" : "th";
  const std::string which = "every " + std::to_string(every) + suffix + " block: ";
  if (picked == 0) return "selective (" + which + "none" + of + "; selective_ac_option exceeds the block count)";
  return "selective (" + which + std::to_string(picked) + of + ")";
}

BlockCheckpointing block_checkpointing(const std::string& mode, const std::string& selective_ac_option,
                                       bool preserve_rng_state) {
  BlockCheckpointing b;
  b.options.preserve_rng_state = preserve_rng_state;
  if (mode == "none") return b;
  if (mode == "full") {
    b.mode = ActivationCheckpointMode::kFull;
    return b;
  }
  if (mode != "selective") {
    throw std::invalid_argument("activation_checkpoint.mode = \"" + mode + "\" is not one of none, full, selective");
  }
  b.mode = ActivationCheckpointMode::kSelective;
  if (selective_ac_option == "op") {
    throw std::invalid_argument(
        "activation_checkpoint.selective_ac_option = \"op\" (per-operator selective checkpointing) is not supported; "
        "supported: a positive integer N, checkpointing every N-th transformer block");
  }
  const bool digits = !selective_ac_option.empty() && selective_ac_option.size() <= 9 &&
                      selective_ac_option.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || std::stoll(selective_ac_option) < 1) {
    throw std::invalid_argument("activation_checkpoint.selective_ac_option = \"" + selective_ac_option +
                                "\": expected a positive integer N (checkpoint every N-th transformer block)");
  }
  b.every = std::stoll(selective_ac_option);
  return b;
}

at::Tensor run_block(const BlockCheckpointing& policy, int64_t index, const torch::nn::Module& block,
                     const std::function<at::Tensor(const at::Tensor&)>& forward, const at::Tensor& input) {
  if (!policy.checkpoints(index)) return forward(input);
  // A copy: backward calls it again, after the caller's loop has moved on.
  const CheckpointedFunction function = [forward](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{forward(in[0])};
  };
  return checkpoint(function, {input}, block.parameters(), policy.options)[0];
}

}  // namespace hyper_parallel
