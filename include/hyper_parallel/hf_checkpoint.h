// Hugging Face checkpoints in and out of our models: a model family's state-dict adapter
// (its parameter names against the checkpoint's, and the q/k RoPE row order), and the
// loader that fills a (possibly tensor-parallel) module from a folder holding
// `model.safetensors` or a sharded `model.safetensors.index.json`.
//
//   Llama model(LlamaArgs::from_hf_config_file(dir + "/config.json"));
//   parallelize_llama(model, tp_mesh, /*loss_parallel=*/true);
//   load_hf_checkpoint(*model, llama_hf_adapter(model->args()), dir);
//
// Each rank copies only its own shard's rows/columns out of the memory-mapped files,
// converting the checkpoint's dtype (BF16, F16, F32, F64) into its parameters' dtype; no
// rank holds the full model. Every error (a missing or unexpected tensor, a shape that
// differs, a truncated file, an unknown dtype) names the file and the tensor and is found
// before any rank copies anything, so every rank raises the same one.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace hyper_parallel {

// One of our parameters and where a Hugging Face checkpoint keeps it.
struct HfTensorMapping {
  std::string ours;  // our parameter's name (Module::named_parameters())
  std::string hf;    // the checkpoint's tensor name (several of ours may read one: tied weights)
  // > 0: the rows are heads of this size in transformers' rotate-half RoPE order
  // (i, i + head_dim/2); ours rotate adjacent pairs (2i, 2i+1).
  int64_t rope_head_dim = 0;
};
using HfAdapter = std::vector<HfTensorMapping>;

// The per-head row permutation between transformers' rotate-half layout and ours: view
// rows as [heads, 2, head_dim/2] and swap the last two (and back). It stays inside a head,
// so it applies to any piece made of whole heads (a TP shard). Round trips are exact.
at::Tensor rope_rows_from_hf(const at::Tensor& w, int64_t head_dim);
at::Tensor rope_rows_to_hf(const at::Tensor& w, int64_t head_dim);

// Fills `model`'s parameters from the checkpoint folder (see above). Tensors the checkpoint
// keeps that the adapter does not name are an error, except derived buffers older
// transformers saved (`*.rotary_emb.inv_freq`).
void load_hf_checkpoint(torch::nn::Module& model, const HfAdapter& adapter, const std::string& folder);

// Full tensors under our names -> under the checkpoint's names, rows back in rotate-half
// order. Several of ours mapped to one name (tied weights) are summed when `sum_shared`
// (gradients), and must be equal otherwise (weights), or this throws naming them.
std::map<std::string, at::Tensor> to_hf_names(const std::map<std::string, at::Tensor>& ours,
                                              const HfAdapter& adapter, bool sum_shared);

}  // namespace hyper_parallel
