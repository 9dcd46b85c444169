// Corpus sidecar parsing with nlohmann-json; integers must be written as integers.
#include "train/data/corpus_sidecar.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "compat/file_system.h"

namespace hyper_parallel::train {
namespace {

// Field `key` as a non-negative integer, or `absent` when missing or null.
int64_t optional_count(const nlohmann::json& j, const char* key, int64_t absent, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absent;
  TORCH_CHECK(it->is_number_integer() && !(it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX}) &&
                  it->get<int64_t>() >= 0,
              "corpus sidecar '", path, "': field '", key, "' must be a non-negative integer, got ", it->dump());
  return it->get<int64_t>();
}

std::string optional_string(const nlohmann::json& j, const char* key, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  TORCH_CHECK(it->is_string(), "corpus sidecar '", path, "': field '", key, "' must be a string, got ", it->dump());
  return it->get<std::string>();
}

}  // namespace

std::string corpus_prefix(const std::string& corpus_path) {
  const bool suffixed = corpus_path.ends_with(".bin") || corpus_path.ends_with(".idx");
  return suffixed ? corpus_path.substr(0, corpus_path.size() - 4) : corpus_path;
}

std::string sidecar_path_for(const std::string& corpus_path) { return corpus_prefix(corpus_path) + ".json"; }

std::optional<CorpusSidecar> read_corpus_sidecar(const std::string& corpus_path) {
  CorpusSidecar s;
  s.path = sidecar_path_for(corpus_path);
  if (!compat::path_exists(s.path)) return std::nullopt;
  std::ifstream in(s.path, std::ios::binary);
  TORCH_CHECK(in, "cannot read corpus sidecar '", s.path, "'");
  std::ostringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  TORCH_CHECK(j.is_object(), "corpus sidecar '", s.path, "' is not a JSON object");
  s.format = optional_string(j, "format", s.path);
  TORCH_CHECK(s.format.empty() || s.format == "bin" || s.format == "megatron", "corpus sidecar '", s.path,
              "': format \"", s.format, "\" is not \"bin\" or \"megatron\"");
  s.dtype = optional_string(j, "dtype", s.path);
  s.vocab_size = optional_count(j, "vocab_size", -1, s.path);
  s.eos_id = optional_count(j, "eos_id", -1, s.path);
  s.bos_id = optional_count(j, "bos_id", -1, s.path);
  s.tokenizer = optional_string(j, "tokenizer", s.path);
  s.tokenizer_sha256 = optional_string(j, "tokenizer_sha256", s.path);
  s.documents = optional_count(j, "documents", -1, s.path);
  s.tokens = optional_count(j, "tokens", -1, s.path);
  return s;
}

}  // namespace hyper_parallel::train
