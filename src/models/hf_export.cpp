// export_hf_checkpoint (hf_checkpoint.h): our model -> a Hugging Face checkpoint folder.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "compat/file_system.h"
#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/models/hf_checkpoint.h"
#include "io/whole_file.h"
#include "models/non_finite_values.h"
#include "models/safetensors.h"
#include "models/safetensors_writer.h"
#include "models/staged_folder.h"

namespace hyper_parallel {

namespace {

// What transformers' save_pretrained and tokenizers write next to the weights.
constexpr const char* kSourceFiles[] = {"tokenizer.json",  "tokenizer_config.json",  "special_tokens_map.json",
                                        "tokenizer.model", "generation_config.json", "chat_template.jinja"};
// Token ids of the source's config.json that the family's config cannot know.
constexpr const char* kTokenIds[] = {"bos_token_id", "eos_token_id", "pad_token_id"};

// The ranks exporting together: those of the parameters' mesh (none: one process).
struct Group {
  std::optional<DeviceMesh> mesh;
  bool writer = true;  // the mesh's first rank
};

Group group_of(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  Group g;
  std::string first;
  for (const auto& [name, p] : params) {
    if (!is_dtensor(p)) continue;
    if (!g.mesh) {
      g.mesh = mesh_of(p);
      first = name;
    } else if (mesh_of(p) != *g.mesh) {
      throw std::invalid_argument("export_hf_checkpoint: parameters " + first + " and " + name +
                                  " live on different meshes; the export gathers over one");
    }
  }
  if (g.mesh) {
    for (int64_t c : g.mesh->coordinate()) g.writer = g.writer && c == 0;
  }
  return g;
}

// The writer's `text` on every rank: one broadcast per mesh dim, from coordinate 0 along
// it (after dim d, every rank holds what its coordinate-0 neighbour along dims <= d held).
std::string from_writer(const Group& g, const std::string& text) {
  if (!g.mesh) return text;
  const auto opts = at::TensorOptions().device(g.mesh->device());
  at::Tensor length = at::empty({1}, at::kLong);
  length.data_ptr<int64_t>()[0] = static_cast<int64_t>(text.size());
  length = length.to(g.mesh->device());
  for (int64_t d = 0; d < g.mesh->ndim(); ++d) g.mesh->comm(d).broadcast_(length, 0);
  const int64_t n = length.cpu().item<int64_t>();
  if (n == 0) return {};
  at::Tensor bytes = at::empty({n}, opts.dtype(at::kByte));
  if (g.writer) {
    at::Tensor host = at::empty({n}, at::kByte);
    std::memcpy(host.data_ptr(), text.data(), static_cast<size_t>(n));
    bytes.copy_(host);
  }
  for (int64_t d = 0; d < g.mesh->ndim(); ++d) g.mesh->comm(d).broadcast_(bytes, 0);
  bytes = bytes.cpu();
  return std::string(static_cast<const char*>(bytes.const_data_ptr()), static_cast<size_t>(n));
}

// Throws on every rank when the writer failed (`error` is only the writer's own).
void raise_writer_error(const Group& g, const std::string& error) {
  const std::string shared = from_writer(g, error);
  if (!shared.empty()) throw std::runtime_error(shared);
}

std::string torch_dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return "float32";
    case c10::kBFloat16:
      return "bfloat16";
    case c10::kHalf:
      return "float16";
    case c10::kDouble:
      return "float64";
    default:
      throw std::invalid_argument(std::string("export_hf_checkpoint: dtype ") + c10::toString(t) +
                                  " is not one to export weights in (bfloat16, float16, float32, float64)");
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const std::string& path, const std::string& text) { io::write_file_atomically(path, text); }

// One tensor of the checkpoint and the parameter(s) of ours it is written from.
struct Output {
  std::string name;
  const HfTensorMapping* mapping;
  at::Tensor param;
  int64_t bytes = 0;
};

// The whole parameter on every rank, in the checkpoint's row order.
at::Tensor gather(const at::Tensor& param, const HfTensorMapping& m) {
  at::Tensor full = (is_dtensor(param) ? full_tensor(param) : param).detach();
  return m.rope_head_dim > 0 ? rope_rows_to_hf(full, m.rope_head_dim) : full;
}

// transformers' (huggingface_hub's) split: in state-dict order, a tensor that does not fit
// the current file starts the next; one larger than the limit gets a file of its own.
std::vector<std::vector<const Output*>> split_into_shards(const std::vector<Output>& outputs, int64_t max_bytes) {
  std::vector<std::vector<const Output*>> shards;
  std::vector<const Output*> current;
  int64_t current_bytes = 0;
  for (const Output& o : outputs) {
    if (o.bytes > max_bytes) {
      shards.push_back({&o});
      continue;
    }
    if (current_bytes + o.bytes > max_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(&o);
    current_bytes += o.bytes;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// What an export writes (or an earlier, non-atomic one left half-written): never carried
// over from the folder it replaces, where a stale index or model.safetensors would be read
// instead of, or mixed with, the new files.
bool is_export_file(const std::string& name) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == hf::kSingleFile || name == hf::kIndexFile || std::regex_match(name, shard) ||
         name.find(".tmp-") != std::string::npos;
}

}  // namespace

HfExportResult export_hf_checkpoint(const torch::nn::Module& model, const HfAdapter& adapter,
                                    const HfConfigWriter& config, const std::string& folder,
                                    const HfExportOptions& options) {
  // 1. Checks on what every rank sees alike: every rank raises the same error.
  const std::string what = "export_hf_checkpoint to '" + folder + "': ";
  if (folder.empty()) throw std::invalid_argument("export_hf_checkpoint: no folder given");
  if (options.max_shard_bytes <= 0) {
    throw std::invalid_argument(what + "max_shard_bytes = " + std::to_string(options.max_shard_bytes) + " must be > 0");
  }
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::map<std::string, at::Tensor> by_name;
  for (const auto& p : model.named_parameters()) {
    params.emplace_back(p.key(), p.value());
    by_name[p.key()] = p.value();
  }
  if (params.empty()) throw std::invalid_argument(what + "the model has no parameters");
  const c10::ScalarType dtype = options.dtype.value_or(params.front().second.scalar_type());
  const std::string dtype_name = torch_dtype_name(dtype);
  // A tied model holds one parameter for its embeddings and head: the adapter names it once.
  std::set<std::string> mapped, hf_names;
  for (const auto& m : adapter) {
    if (!by_name.count(m.ours))
      throw std::invalid_argument(what + "the adapter names '" + m.ours + "', which the model does not have");
    if (!hf_names.insert(m.hf).second) {
      throw std::invalid_argument(what + "the adapter maps two of our parameters to '" + m.hf + "'");
    }
    mapped.insert(m.ours);
  }
  for (const auto& [name, p] : params) {
    if (!mapped.count(name))
      throw std::invalid_argument(what + "our parameter '" + name + "' has no Hugging Face name in the adapter");
  }
  const Group group = group_of(params);

  // 2. The writer stages the new folder beside the old one (staged_folder.h) before anyone
  // gathers anything: an export is swapped in whole or not at all.
  std::string error;
  std::optional<hf::StagedFolder> staged;
  if (group.writer) {
    if (compat::path_exists(folder) && !compat::is_directory(folder)) {
      error = what + "it is a file, not a folder";
    } else if (!options.source_folder.empty() && !compat::is_directory(options.source_folder)) {
      error = what + "the source folder '" + options.source_folder + "' (tokenizer files) is not a folder";
    } else {
      try {
        staged.emplace(folder);
      } catch (const std::exception& e) {
        error = what + e.what();
      }
    }
  }
  raise_writer_error(group, error);
  const std::string out = staged ? staged->path() : folder;

  at::NoGradGuard no_grad;
  // 3. The checkpoint's tensors in adapter order.
  std::vector<Output> outputs;
  for (const auto& m : adapter) outputs.push_back({m.hf, &m, by_name.at(m.ours), 0});
  HfExportResult result;
  for (Output& o : outputs) {
    int64_t numel = 1;
    for (int64_t s : o.param.sizes()) numel *= s;  // global (a DTensor's sizes are)
    o.bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
    result.total_bytes += o.bytes;
  }

  // 4. Shard by shard: every rank gathers each tensor; the writer keeps one file's worth.
  const auto shards = split_into_shards(outputs, options.max_shard_bytes);
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shards.size() == 1 ? hf::kSingleFile : shard_name(i, shards.size());
    std::map<std::string, at::Tensor> tensors;
    for (const Output* o : shards[i]) {
      at::Tensor t = gather(o->param, *o->mapping);
      // Every rank holds the whole tensor: all raise the same error.
      const int64_t bad = hf::first_non_finite_code(t);
      if (bad >= 0) {
        throw std::runtime_error(what + "the weights of '" + o->mapping->ours + "' (" + o->name + ") hold " +
                                 hf::describe_non_finite_code(bad, t.sizes()) +
                                 ": a checkpoint of non-finite weights is not exported (the run had diverged?)");
      }
      if (group.writer) tensors[o->name] = t.to(dtype).contiguous();  // round to nearest even, as Tensor.to
      weight_map[o->name] = file;
    }
    result.files.push_back(file);
    if (group.writer && error.empty()) {
      try {
        hf::write_safetensors(compat::join_path(out, file), tensors, {{"format", "pt"}});
      } catch (const std::exception& e) {
        error = what + e.what();
      }
    }
  }

  // 5. The index, config.json and the source's files; then the swap.
  if (group.writer && error.empty()) {
    try {
      if (shards.size() > 1) {
        int64_t parameters = 0;
        for (const Output& o : outputs) parameters += o.bytes / static_cast<int64_t>(c10::elementSize(dtype));
        const nlohmann::json index = {
            {"metadata", {{"total_size", result.total_bytes}, {"total_parameters", parameters}}},
            {"weight_map", weight_map}};
        write_text(compat::join_path(out, hf::kIndexFile), index.dump(2) + "\n");
        result.files.push_back(hf::kIndexFile);
      }
      nlohmann::json cfg = nlohmann::json::parse(config());
      cfg["dtype"] = dtype_name;  // transformers 5's name for torch_dtype
      const std::string source_config = compat::join_path(options.source_folder, "config.json");
      if (!options.source_folder.empty() && compat::path_exists(source_config)) {
        const nlohmann::json source = nlohmann::json::parse(read_text(source_config));
        for (const char* key : kTokenIds) {
          if (source.contains(key)) cfg[key] = source.at(key);
        }
      }
      write_text(compat::join_path(out, "config.json"), cfg.dump(2) + "\n");
      result.files.push_back("config.json");
      for (const char* name : kSourceFiles) {
        const std::string from = compat::join_path(options.source_folder, name);
        if (options.source_folder.empty() || !compat::path_exists(from)) continue;
        write_text(compat::join_path(out, name), read_text(from));
        result.files.push_back(name);
      }
      staged->commit([](const std::string& name) { return !is_export_file(name); });
    } catch (const std::exception& e) {
      error = what + e.what();
    }
  }
  raise_writer_error(group, error);
  // Every rank returns the writer's list (only it looked for the source's files).
  std::string files;
  for (const auto& f : result.files) files += f + "\n";
  std::istringstream lines(from_writer(group, files));
  result.files.clear();
  for (std::string line; std::getline(lines, line);) result.files.push_back(line);
  return result;
}

}  // namespace hyper_parallel
