// Hugging Face checkpoints in and out of our models: a model family's state-dict adapter
// (its parameter names against the checkpoint's, and the q/k RoPE row order), the loader
// that fills a (possibly tensor-parallel) module from a folder holding `model.safetensors`
// or a sharded `model.safetensors.index.json`, and the export that writes such a folder.
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

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace torch::nn {
class Module;
}

namespace hyper_parallel {

// One of our parameters and where a Hugging Face checkpoint keeps it.
struct HfTensorMapping {
  std::string ours;  // our parameter's name (Module::named_parameters())
  std::string hf;    // the checkpoint's tensor name
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
std::map<std::string, at::Tensor> to_hf_names(const std::map<std::string, at::Tensor>& ours, const HfAdapter& adapter,
                                              bool sum_shared);

// config.json's text for the exported model (the export adds "dtype" and the source's
// token ids).
using HfConfigWriter = std::function<std::string()>;

struct HfExportOptions {
  // Of the written tensors (BF16, F16, F32 or F64); unset: the parameters' own dtype, as
  // transformers' save_pretrained keeps the model's.
  std::optional<c10::ScalarType> dtype;
  // Above this many bytes of tensor data the weights are split into
  // model-0000i-of-0000N.safetensors with a model.safetensors.index.json, as transformers
  // splits them (a tensor larger than this gets a file of its own); the default is
  // transformers 5's max_shard_size, "50GB".
  int64_t max_shard_bytes = 50'000'000'000;
  // A Hugging Face folder the model came from: its tokenizer files and
  // generation_config.json are copied, and its config's token ids (bos/eos/pad) kept.
  std::string source_folder;
};

struct HfExportResult {
  std::vector<std::string> files;  // written, in the folder, in writing order
  int64_t total_bytes = 0;         // of tensor data (the index's metadata.total_size)
};

// Writes `model` as a Hugging Face checkpoint folder: config.json (from `config`),
// model.safetensors or shards with their index, and the source's tokenizer files.
// Collective: every rank holding a piece of the model calls it (each full tensor is
// gathered over the parameters' mesh, one at a time, in the same order everywhere); the
// mesh's first rank writes. q/k rows are written back in rotate-half order. A tied model
// holds one parameter for its embeddings and head, so it is written once, as the adapter
// names it (config.json says tie_word_embeddings). Every file is
// written atomically; shards and the single file of an earlier export in the folder are
// replaced (a stale index would otherwise win over a new model.safetensors). Any error
// (a folder that cannot be written, a full disk) is raised on every rank with the same
// message.
HfExportResult export_hf_checkpoint(const torch::nn::Module& model, const HfAdapter& adapter,
                                    const HfConfigWriter& config, const std::string& folder,
                                    const HfExportOptions& options = {});

}  // namespace hyper_parallel

HP_PUBLIC_END
