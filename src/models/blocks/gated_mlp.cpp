// The gated MLP: SwiGLU or GeGLU (tanh-approximated GELU).
#include <ATen/ATen.h>

#include "hyper_parallel/models/decoder_blocks.h"
#include "hyper_parallel/nn/parameters_on_meta.h"
#include "models/module_input.h"

namespace hyper_parallel {

GatedMlpImpl::GatedMlpImpl(const GatedMlpOptions& o) : options_(o) {
  TORCH_CHECK(o.dim > 0 && o.hidden_dim > 0, "GatedMlp: dim ", o.dim, " and hidden_dim ", o.hidden_dim, " must be > 0");
  w1 = register_module("w1", new_linear(o.dim, o.hidden_dim));
  w2 = register_module("w2", new_linear(o.hidden_dim, o.dim));
  w3 = register_module("w3", new_linear(o.dim, o.hidden_dim));
}

at::Tensor GatedMlpImpl::forward(const at::Tensor& x) {
  const at::Tensor in = shared_input(x, {w1.get(), w3.get()});
  const at::Tensor gate = parallel_forward(w1, in);
  const at::Tensor activated = options_.activation == MlpActivation::silu ? at::silu(gate) : at::gelu(gate, "tanh");
  return parallel_forward(w2, activated * parallel_forward(w3, in));
}

}  // namespace hyper_parallel
