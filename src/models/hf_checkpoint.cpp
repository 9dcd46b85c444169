#include "hyper_parallel/models/hf_checkpoint.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <set>
#include <stdexcept>

#include "compat/file_system.h"
#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "models/non_finite_values.h"
#include "models/safetensors.h"

namespace hyper_parallel {

namespace {

std::string shape_string(c10::IntArrayRef s) { return c10::str(s); }

// The checkpoint's tensors and the mapped file holding each (by the index's weight_map
// when the checkpoint is sharded: one layer's tensors may sit in different files).
class CheckpointFiles {
 public:
  struct Located {
    const hf::SafetensorsFile* file;
    const hf::SafetensorsEntry* entry;
  };

  explicit CheckpointFiles(const std::string& folder) {
    const std::string index = compat::join_path(folder, hf::kIndexFile);
    const std::string single = compat::join_path(folder, hf::kSingleFile);
    // transformers reads model.safetensors when both are there, and save_pretrained of an
    // unsharded model leaves an earlier index behind: which one is meant is not ours to guess.
    if (compat::path_exists(index) && compat::path_exists(single)) {
      throw std::runtime_error("Hugging Face checkpoint " + folder + " holds both " + hf::kSingleFile + " and " +
                               hf::kIndexFile +
                               " (transformers reads the first, an index left by an earlier sharded "
                               "save would name other files): remove the one that is stale");
    }
    if (compat::path_exists(index)) {
      read_index(folder, index);
    } else if (compat::path_exists(single)) {
      const auto& f = open(single);
      for (const auto& [name, e] : f.header().tensors) tensors_[name] = {&f, &e};
    } else {
      throw std::runtime_error("Hugging Face checkpoint " + folder + ": neither " + hf::kSingleFile + " nor " +
                               hf::kIndexFile + " is there");
    }
  }
  const std::map<std::string, Located>& tensors() const { return tensors_; }

 private:
  const hf::SafetensorsFile& open(const std::string& path) {
    files_.push_back(std::make_unique<hf::SafetensorsFile>(path));
    return *files_.back();
  }

  void read_index(const std::string& folder, const std::string& index) {
    nlohmann::json j;
    try {
      std::ifstream in(index);
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(index + ": not valid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object()) {
      throw std::runtime_error(index + ": expected {\"weight_map\": {tensor: file, ...}}");
    }
    std::map<std::string, const hf::SafetensorsFile*> by_file;
    for (const auto& [name, file] : j.at("weight_map").items()) {
      if (!file.is_string()) throw std::runtime_error(index + ": weight_map['" + name + "'] is not a file name");
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos) {
        throw std::runtime_error(index + ": weight_map['" + name + "'] = \"" + f + "\" is not a file in the folder");
      }
      if (!by_file.count(f)) by_file[f] = &open(compat::join_path(folder, f));
      const hf::SafetensorsFile* sf = by_file[f];
      tensors_[name] = {sf, &sf->entry(name)};
    }
    for (const auto& [f, sf] : by_file) {
      for (const auto& [name, e] : sf->header().tensors) {
        auto it = tensors_.find(name);
        if (it == tensors_.end() || it->second.file != sf) {
          throw std::runtime_error(sf->path() + ": tensor '" + name + "' is not in " + index +
                                   "'s weight_map under this file");
        }
      }
    }
  }

  std::vector<std::unique_ptr<hf::SafetensorsFile>> files_;
  std::map<std::string, Located> tensors_;
};

// The box [offset, offset + shape) of a tensor stored contiguously at `src`, copied into a
// new contiguous tensor of the file's dtype: memcpy per innermost run, so unaligned data
// is fine and the pages outside the box are not read (beyond the runs' own pages).
at::Tensor read_box(const uint8_t* src, const hf::SafetensorsEntry& e, c10::IntArrayRef offset,
                    c10::IntArrayRef shape) {
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(e.dtype));
  const int64_t nd = static_cast<int64_t>(shape.size());
  const size_t item = c10::elementSize(e.dtype);
  if (out.numel() == 0) return out;
  if (nd == 0) {
    std::memcpy(out.data_ptr(), src, item);
    return out;
  }
  std::vector<int64_t> stride(nd, 1);
  for (int64_t d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * e.shape[d + 1];
  const size_t run = static_cast<size_t>(shape[nd - 1]) * item;
  std::vector<int64_t> index(nd - 1, 0);
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t r = 0, rows = out.numel() / shape[nd - 1]; r < rows; ++r) {
    int64_t at = offset[nd - 1];
    for (int64_t d = 0; d < nd - 1; ++d) at += (offset[d] + index[d]) * stride[d];
    std::memcpy(dst + r * run, src + static_cast<size_t>(at) * item, run);
    for (int64_t d = nd - 2; d >= 0 && ++index[d] == shape[d]; --d) index[d] = 0;
  }
  return out;
}

bool is_derived_buffer(const std::string& hf_name) {
  const std::string suffix = "rotary_emb.inv_freq";
  return hf_name.size() >= suffix.size() && hf_name.compare(hf_name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<int64_t> rope_view(const at::Tensor& w, int64_t head_dim, bool from_hf) {
  TORCH_CHECK(w.dim() >= 1 && head_dim % 2 == 0 && w.size(0) % head_dim == 0, "RoPE row permutation: ", w.size(0),
              " rows are not whole heads of ", head_dim);
  std::vector<int64_t> v = {-1, from_hf ? 2 : head_dim / 2, from_hf ? head_dim / 2 : 2};
  v.insert(v.end(), w.sizes().begin() + 1, w.sizes().end());
  return v;
}

}  // namespace

at::Tensor rope_rows_from_hf(const at::Tensor& w, int64_t head_dim) {
  return w.reshape(rope_view(w, head_dim, true)).transpose(1, 2).reshape(w.sizes());
}

at::Tensor rope_rows_to_hf(const at::Tensor& w, int64_t head_dim) {
  return w.reshape(rope_view(w, head_dim, false)).transpose(1, 2).reshape(w.sizes());
}

void load_hf_checkpoint(torch::nn::Module& model, const HfAdapter& adapter, const std::string& folder) {
  const CheckpointFiles ckpt(folder);
  std::map<std::string, const HfTensorMapping*> by_ours;
  for (const auto& m : adapter) by_ours[m.ours] = &m;

  // Every check first, from what every rank sees alike (global shapes, the headers), so
  // that all ranks raise the same error before any copies anything.
  struct Copy {
    at::Tensor param;
    const HfTensorMapping* mapping;
    CheckpointFiles::Located source;
  };
  std::vector<Copy> copies;
  std::vector<std::string> problems;
  std::set<std::string> used;
  for (const auto& item : model.named_parameters()) {
    const std::string& ours = item.key();
    const at::Tensor& p = item.value();
    auto m = by_ours.find(ours);
    if (m == by_ours.end()) {
      problems.push_back("our parameter '" + ours + "' has no Hugging Face name in the model's adapter");
      continue;
    }
    const std::string& name = m->second->hf;
    auto t = ckpt.tensors().find(name);
    if (t == ckpt.tensors().end()) {
      problems.push_back("missing tensor '" + name + "' (for " + ours + " " + shape_string(p.sizes()) + ")");
      continue;
    }
    used.insert(name);
    const hf::SafetensorsEntry& e = *t->second.entry;
    const std::string where = t->second.file->path() + ": tensor '" + name + "' ";
    if (!c10::isFloatingType(e.dtype)) {
      problems.push_back(where + "has dtype " + e.dtype_name + ", expected a floating dtype (BF16, F16, F32, F64)");
    } else if (c10::IntArrayRef(e.shape) != p.sizes()) {
      problems.push_back(where + "has shape " + shape_string(e.shape) + ", the model expects " +
                         shape_string(p.sizes()) + " for " + ours);
    } else {
      copies.push_back({p, m->second, t->second});
    }
  }
  for (const auto& [name, located] : ckpt.tensors()) {
    if (!used.count(name) && !is_derived_buffer(name)) {
      problems.push_back(located.file->path() + ": unexpected tensor '" + name + "' " +
                         shape_string(located.entry->shape) + " (the model has no parameter for it)");
    }
  }
  if (!problems.empty()) {
    std::string text = "cannot load the Hugging Face checkpoint in " + folder + ":";
    for (const auto& p : problems) text += "\n  " + p;
    throw std::runtime_error(text);
  }

  at::NoGradGuard no_grad;
  // Per copy, the first non-finite element of this rank's piece (in the file's order).
  at::Tensor bad = at::full({static_cast<int64_t>(copies.size())}, INT64_MAX, at::kLong);
  std::vector<DeviceMesh> meshes;
  for (const Copy& c : copies) {
    if (is_dtensor(c.param) && std::find(meshes.begin(), meshes.end(), mesh_of(c.param)) == meshes.end()) {
      meshes.push_back(mesh_of(c.param));
    }
  }
  // An error of this rank's copies waits for the collective below, which every rank joins.
  std::exception_ptr copy_error;
  for (size_t i = 0; i < copies.size() && !copy_error; ++i) {
    try {
      const Copy& c = copies[i];
      at::Tensor local = is_dtensor(c.param) ? to_local(c.param) : c.param;
      const std::vector<int64_t> offset =
          is_dtensor(c.param) ? layout_of(c.param).local_offset() : std::vector<int64_t>(local.dim(), 0);
      const hf::SafetensorsEntry& e = *c.source.entry;
      at::Tensor piece = read_box(c.source.file->data(e), e, offset, local.sizes());
      const int64_t code = hf::first_non_finite_code(piece, offset, e.shape);
      if (code >= 0) bad.data_ptr<int64_t>()[i] = code;
      if (c.mapping->rope_head_dim > 0) {
        TORCH_CHECK(offset[0] % c.mapping->rope_head_dim == 0, "load_hf_checkpoint: ", c.mapping->ours,
                    "'s shard starts inside a head (row ", offset[0], ", head_dim ", c.mapping->rope_head_dim, ")");
        piece = rope_rows_from_hf(piece, c.mapping->rope_head_dim);
      }
      local.copy_(piece);
      c.source.file->release(e);
    } catch (...) {
      copy_error = std::current_exception();
    }
  }
  // Every rank learns the first bad element of every piece, so all raise the same error.
  for (const DeviceMesh& mesh : meshes) {
    at::Tensor on_device = bad.to(mesh.device());
    for (int64_t d = 0; d < mesh.ndim(); ++d) mesh.comm(d).all_reduce_(on_device, ReduceOp::Min);
    bad = on_device.cpu();
  }
  if (copy_error) std::rethrow_exception(copy_error);
  for (size_t i = 0; i < copies.size(); ++i) {
    const int64_t code = bad.data_ptr<int64_t>()[i];
    if (code == INT64_MAX) continue;
    const hf::SafetensorsEntry& e = *copies[i].source.entry;
    throw std::runtime_error("cannot load the Hugging Face checkpoint in " + folder + ": " +
                             copies[i].source.file->path() + ": tensor '" + copies[i].mapping->hf + "' holds " +
                             hf::describe_non_finite_code(code, e.shape) + " (for " + copies[i].mapping->ours +
                             "): weights must be finite; the checkpoint is damaged or was saved from a diverged run");
  }
}

std::map<std::string, at::Tensor> to_hf_names(const std::map<std::string, at::Tensor>& ours, const HfAdapter& adapter,
                                              bool sum_shared) {
  std::map<std::string, at::Tensor> out;
  std::map<std::string, std::string> first_source;
  for (const auto& m : adapter) {
    auto it = ours.find(m.ours);
    if (it == ours.end()) throw std::invalid_argument("to_hf_names: no tensor named '" + m.ours + "'");
    at::Tensor t = m.rope_head_dim > 0 ? rope_rows_to_hf(it->second, m.rope_head_dim) : it->second;
    auto [slot, fresh] = out.emplace(m.hf, t);
    if (fresh) {
      first_source[m.hf] = m.ours;
    } else if (sum_shared) {
      slot->second = slot->second.add(t);
    } else if (!at::equal(slot->second, t)) {
      throw std::runtime_error("to_hf_names: " + first_source[m.hf] + " and " + m.ours + " both map to " + m.hf +
                               " but differ (untied by training?)");
    }
  }
  return out;
}

}  // namespace hyper_parallel
