#include "hyper_parallel/nn/parallel_style.h"

#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <mutex>
#include <sstream>
#include <unordered_map>

#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/nn/module_utils.h"
#include "nn/parameter_table.h"

namespace hyper_parallel {

namespace {

// Parallelized modules by address. The weak pointer tells a live module from a new one
// that happens to reuse a dead module's address (which must not inherit its layouts).
struct Entry {
  std::weak_ptr<torch::nn::Module> module;
  ModuleLayouts layouts;
};
std::mutex registry_mutex;
std::unordered_map<const torch::nn::Module*, Entry>& registry() {
  static auto* r = new std::unordered_map<const torch::nn::Module*, Entry>();
  return *r;
}

// Equal once negative shard dims are resolved for a tensor of `ndim` dims (Shard(-1) is
// Shard(1) of a matrix): comparing them raw would redistribute to where it already is.
bool same_placements(const Placements& a, const Placements& b, int64_t ndim) {
  if (a.size() != b.size()) return false;
  for (size_t m = 0; m < a.size(); ++m) {
    if (!(a[m].normalized(ndim) == b[m].normalized(ndim))) return false;
  }
  return true;
}

Placements on_mesh(const std::optional<Placements>& given, Placement fallback, const DeviceMesh& mesh) {
  if (given) return *given;
  return Placements(mesh.ndim(), fallback);
}

// Puts this rank's piece of the module's own (identically initialised) parameter in
// place, keeps requires_grad, and makes the gradient come back in the same layout.
at::Tensor shard_parameter(torch::nn::Module& module, const std::string& name, const DeviceMesh& mesh,
                           const Placements& placements, std::optional<int64_t> src_data_rank) {
  at::Tensor full = module.named_parameters(/*recurse=*/false)[name];
  at::Tensor d = distribute_tensor(full.detach(), mesh, placements, src_data_rank);
  replace_parameter(module, name, d);
  at::Tensor param = module.named_parameters(false)[name];
  // Autograd may produce a gradient in another layout (e.g. a replicated embedding
  // gradient): bring it to the parameter's own, so optimizers and clipping see one layout.
  param.register_hook([placements](const at::Tensor& grad) -> at::Tensor {
    if (!is_dtensor(grad) || same_placements(placements_of(grad), placements, grad.dim())) return grad;
    return redistribute(grad, placements);
  });
  return param;
}

std::string type_error(const std::string& style, const std::string& path, const torch::nn::Module& m) {
  return style + ": module '" + path + "' is a " + m.name() + "; expected torch::nn::Linear or torch::nn::Embedding";
}

}  // namespace

ModuleLayouts ColwiseParallel::apply(torch::nn::Module& module, const std::string& path, const DeviceMesh& mesh,
                                     std::optional<int64_t> src_data_rank) const {
  ModuleLayouts l;
  l.mesh = mesh;
  l.input_layouts = on_mesh(options_.input_layouts, Placement::replicate(), mesh);
  l.desired_input = Placements(mesh.ndim(), Placement::replicate());
  l.output_layouts = on_mesh(options_.output_layouts, Placement::shard(-1), mesh);
  l.use_local_output = options_.use_local_output;
  if (auto* lin = dynamic_cast<torch::nn::LinearImpl*>(&module)) {
    // A weight the module does not register is another module's parameter (a head tied
    // to the embeddings): its owner shards it, and the model points the head at the result.
    if (has_own_parameter(module, "weight")) {
      lin->weight = shard_parameter(module, "weight", mesh, {Placement::shard(0)}, src_data_rank);
    }
    if (lin->bias.defined()) lin->bias = shard_parameter(module, "bias", mesh, {Placement::shard(0)}, src_data_rank);
  } else if (auto* emb = dynamic_cast<torch::nn::EmbeddingImpl*>(&module)) {
    emb->weight = shard_parameter(module, "weight", mesh, {Placement::shard(1)}, src_data_rank);
  } else {
    TORCH_CHECK(false, type_error(name(), path, module));
  }
  return l;
}

ModuleLayouts RowwiseParallel::apply(torch::nn::Module& module, const std::string& path, const DeviceMesh& mesh,
                                     std::optional<int64_t> src_data_rank) const {
  ModuleLayouts l;
  l.mesh = mesh;
  l.output_layouts = on_mesh(options_.output_layouts, Placement::replicate(), mesh);
  l.use_local_output = options_.use_local_output;
  if (auto* lin = dynamic_cast<torch::nn::LinearImpl*>(&module)) {
    l.input_layouts = on_mesh(options_.input_layouts, Placement::shard(-1), mesh);
    l.desired_input = Placements(mesh.ndim(), Placement::shard(-1));
    lin->weight = shard_parameter(module, "weight", mesh, {Placement::shard(1)}, src_data_rank);
    if (lin->bias.defined()) lin->bias = shard_parameter(module, "bias", mesh, {Placement::replicate()}, src_data_rank);
  } else if (auto* emb = dynamic_cast<torch::nn::EmbeddingImpl*>(&module)) {
    l.input_layouts = on_mesh(options_.input_layouts, Placement::replicate(), mesh);
    l.desired_input = Placements(mesh.ndim(), Placement::replicate());
    emb->weight = shard_parameter(module, "weight", mesh, {Placement::shard(0)}, src_data_rank);
  } else {
    TORCH_CHECK(false, type_error(name(), path, module));
  }
  return l;
}

ModuleLayouts PrepareModuleInput::apply(torch::nn::Module&, const std::string&, const DeviceMesh& mesh,
                                        std::optional<int64_t>) const {
  ModuleLayouts l;
  l.mesh = mesh;
  l.input_layouts = input_;
  l.desired_input = desired_;
  l.output_layouts = {};
  l.use_local_input = local_;
  return l;
}

ModuleLayouts SequenceParallel::apply(torch::nn::Module& module, const std::string& path, const DeviceMesh& mesh,
                                      std::optional<int64_t> src_data_rank) const {
  const auto params = module.named_parameters(/*recurse=*/false);
  TORCH_CHECK(module.children().empty(), name(), ": module '", path, "' is a ", module.name(),
              " with sub-modules; expected a leaf module that works per token (a norm)");
  // Replicated, with a hook that turns the Partial gradient (this rank's tokens only)
  // into the sum over the TP ranks.
  for (const auto& item : params) shard_parameter(module, item.key(), mesh, {Placement::replicate()}, src_data_rank);
  ModuleLayouts l;
  l.mesh = mesh;
  l.input_layouts = Placements(mesh.ndim(), Placement::shard(sequence_dim_));
  l.desired_input = l.input_layouts;
  l.output_layouts = l.input_layouts;
  l.use_local_output = local_;
  return l;
}

at::Tensor prepare_module_input(const ModuleLayouts& l, const at::Tensor& input) {
  at::Tensor x = is_dtensor(input) ? input : DTensor::from_local(input, l.mesh, l.input_layouts);
  if (!same_placements(placements_of(x), l.desired_input, x.dim())) x = redistribute(x, l.desired_input);
  return l.use_local_input ? to_local(x) : x;
}

at::Tensor prepare_module_output(const ModuleLayouts& l, const at::Tensor& output) {
  if (!is_dtensor(output)) return output;
  at::Tensor y = output;
  if (!l.output_layouts.empty() && !same_placements(placements_of(y), l.output_layouts, y.dim())) {
    y = redistribute(y, l.output_layouts);
  }
  return l.use_local_output ? to_local(y) : y;
}

const ModuleLayouts* module_layouts(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry().find(&module);
  if (it == registry().end()) return nullptr;
  if (it->second.module.lock().get() != &module) {  // a dead module's entry
    registry().erase(it);
    return nullptr;
  }
  return &it->second.layouts;
}

namespace {
bool path_matches(const std::string& pattern, const std::string& path) {
  std::vector<std::string> a, b;
  auto split = [](const std::string& s, std::vector<std::string>& out) {
    std::stringstream ss(s);
    std::string part;
    while (std::getline(ss, part, '.')) out.push_back(part);
  };
  split(pattern, a);
  split(path, b);
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != "*" && a[i] != b[i]) return false;
  }
  return true;
}
}  // namespace

void parallelize_module(torch::nn::Module& root, const DeviceMesh& mesh, const ParallelizePlan& plan,
                        std::optional<int64_t> src_data_rank) {
  TORCH_CHECK(mesh.ndim() == 1, "parallelize_module: expected a 1-D tensor-parallel mesh, got ", mesh.str(),
              "; pass mesh[\"tp\"]");
  const auto modules = root.named_modules(/*name_prefix=*/"", /*include_self=*/false);
  for (const auto& [pattern, style] : plan) {
    bool matched = false;
    for (const auto& item : modules) {
      if (!path_matches(pattern, item.key())) continue;
      matched = true;
      TORCH_CHECK(!module_layouts(*item.value()), "parallelize_module: '", item.key(), "' (matched by '", pattern,
                  "') is already parallelized; expected each module in one plan entry");
      ModuleLayouts l = style->apply(*item.value(), item.key(), mesh, src_data_rank);
      std::lock_guard<std::mutex> lock(registry_mutex);
      registry()[item.value().get()] = Entry{item.value(), std::move(l)};
    }
    TORCH_CHECK(matched, "parallelize_module: plan entry '", pattern, "' (", style->name(),
                ") matches no sub-module of ", root.name());
  }
}

}  // namespace hyper_parallel
