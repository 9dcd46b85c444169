// Building a model whose weights a checkpoint will give, without any rank ever holding all
// of it: PyTorch's `with torch.device("meta")`, which LibTorch lacks (its module
// constructors allocate and initialise every weight on the CPU).
//
// While a ParametersOnMeta lives on this thread, the modules of our model families build
// their linear and embedding weights (new_linear, new_embedding) on the meta device: shapes
// and dtypes, no memory, no initialisation. Norm weights (dim elements, left unsharded by
// TP) and buffers (RoPE tables) are made as usual. Then: shard the model (its family's parallelize: distribute_tensor
// keeps meta tensors on meta), materialize_parameters, and load every weight (load_hf_checkpoint).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// LargeWeights: linear and embedding weights only (a model then materialized and loaded).
// Everything: the norms' weights and the buffers too, so that no tensor of the model holds
// memory (hp-dry-run's model, which is never materialized); it also registers the meta
// kernels LibTorch's C++ build lacks for a training step (compat/meta_kernels.h).
enum class MetaScope { LargeWeights, Everything };

class ParametersOnMeta {
 public:
  explicit ParametersOnMeta(MetaScope scope = MetaScope::LargeWeights);
  ~ParametersOnMeta();
  ParametersOnMeta(const ParametersOnMeta&) = delete;
  ParametersOnMeta& operator=(const ParametersOnMeta&) = delete;

 private:
  bool previous_;
  MetaScope previous_scope_;
};
// Whether a ParametersOnMeta lives on this thread.
bool parameters_on_meta();
// A norm's weight or a buffer as a module creates it: on the meta device (same shape and
// dtype) inside ParametersOnMeta(MetaScope::Everything), `t` itself otherwise.
at::Tensor on_meta_when_everything_is(const at::Tensor& t);

// torch::nn::Linear without bias, and torch::nn::Embedding, as LibTorch builds them, or
// inside ParametersOnMeta with their weight on the meta device (a 1 x 1 module whose weight
// and options are then set to the real shape).
torch::nn::Linear new_linear(int64_t in_features, int64_t out_features);
torch::nn::Embedding new_embedding(int64_t num_embeddings, int64_t embedding_dim);

// Gives every DTensor parameter whose local piece is on the meta device uninitialised memory
// on `device`, in place: modules' members and a tied head see it. A plain parameter still on
// meta is an error (LibTorch cannot materialize it in place; at TP 1 build the model
// normally). Other parameters and the buffers are moved to `device`. The caller fills every
// parameter next (load_hf_checkpoint refuses a checkpoint that lacks one).
void materialize_parameters(torch::nn::Module& module, at::Device device);

}  // namespace hyper_parallel

HP_PUBLIC_END
