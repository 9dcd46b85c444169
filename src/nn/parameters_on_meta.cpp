#include "hyper_parallel/nn/parameters_on_meta.h"

#include <ATen/ops/empty.h>
#include <torch/nn/module.h>

#include <set>
#include <vector>

#include "compat/meta_kernels.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/nn/module_utils.h"

namespace hyper_parallel {

namespace {
thread_local bool tls_parameters_on_meta = false;
thread_local MetaScope tls_meta_scope = MetaScope::LargeWeights;

// In the default dtype, as LibTorch's own modules create their weights.
at::Tensor meta_weight(std::vector<int64_t> shape) { return at::empty(shape, at::TensorOptions().device(at::kMeta)); }
}  // namespace

ParametersOnMeta::ParametersOnMeta(MetaScope scope)
    : previous_(tls_parameters_on_meta), previous_scope_(tls_meta_scope) {
  tls_parameters_on_meta = true;
  tls_meta_scope = scope;
  // A model all on meta is one a step is run on (hp-dry-run): the kernels that needs.
  if (scope == MetaScope::Everything) compat::register_missing_meta_kernels();
}
ParametersOnMeta::~ParametersOnMeta() {
  tls_parameters_on_meta = previous_;
  tls_meta_scope = previous_scope_;
}
bool parameters_on_meta() { return tls_parameters_on_meta; }

at::Tensor on_meta_when_everything_is(const at::Tensor& t) {
  if (!tls_parameters_on_meta || tls_meta_scope != MetaScope::Everything) return t;
  return at::empty(t.sizes(), t.options().device(at::kMeta));
}

torch::nn::Linear new_linear(int64_t in_features, int64_t out_features) {
  if (!parameters_on_meta()) return torch::nn::Linear(torch::nn::LinearOptions(in_features, out_features).bias(false));
  torch::nn::Linear linear(torch::nn::LinearOptions(1, 1).bias(false));
  linear->options.in_features(in_features).out_features(out_features);
  replace_parameter(*linear, "weight", meta_weight({out_features, in_features}));
  linear->weight = linear->named_parameters(/*recurse=*/false)["weight"];
  return linear;
}

torch::nn::Embedding new_embedding(int64_t num_embeddings, int64_t embedding_dim) {
  if (!parameters_on_meta()) return torch::nn::Embedding(num_embeddings, embedding_dim);
  torch::nn::Embedding embedding(torch::nn::EmbeddingOptions(1, 1));
  embedding->options.num_embeddings(num_embeddings).embedding_dim(embedding_dim);
  replace_parameter(*embedding, "weight", meta_weight({num_embeddings, embedding_dim}));
  embedding->weight = embedding->named_parameters(/*recurse=*/false)["weight"];
  return embedding;
}

void materialize_parameters(torch::nn::Module& module, at::Device device) {
  std::set<const c10::TensorImpl*> done;  // a tied weight is one tensor reached twice
  for (auto& p : module.parameters()) {
    if (!done.insert(p.unsafeGetTensorImpl()).second) continue;
    if (is_dtensor(p)) {
      const at::Tensor& local = local_of(p);
      if (!local.is_meta()) continue;
      p.set_data(make_dtensor(at::empty(local.sizes(), local.options().device(device)), layout_of(p)));
    } else if (p.is_meta()) {
      // LibTorch cannot turn a meta tensor into a CPU one in place (set_data refuses the
      // pair), and modules hold their own handles: only DTensor parameters are materialized.
      TORCH_CHECK(false, "materialize_parameters: a parameter of shape ", p.sizes(),
                  " is a plain tensor on the meta device; build on meta only a model whose parallelize makes every "
                  "parameter a DTensor (tensor parallel degree > 1): at TP 1 each rank holds the whole model anyway");
    } else if (p.device() != device) {
      p.set_data(p.to(device));
    }
  }
  for (auto& b : module.buffers()) {
    TORCH_CHECK(!b.is_meta(),
                "materialize_parameters: a buffer is on the meta device; buffers are computed when the "
                "module is built, never on meta");
    if (b.device() != device) b.set_data(b.to(device));
  }
}

}  // namespace hyper_parallel
