// data_identity.cpp — see data_identity.h.
#include "train/data_identity.h"

#include <climits>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

#include "compat/file_system.h"
#include "train/crc32c.h"

namespace hyper_parallel::train {
namespace {

// How data.h turns each corpus into token ids; a new rule must get a new name.
constexpr const char* kWordTokenizer = "hp word-level v1 (lowercased words and punctuation; ids by frequency)";
constexpr const char* kSyntheticTokens = "none (synthetic token ids, Zipf-Markov v1)";

std::string absolute(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : path;
}

uint32_t file_crc32c(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read training.data '" + path + "' to record what it holds");
  std::vector<char> block(1 << 20);
  uint32_t crc = 0;
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    crc = crc32c(block.data(), static_cast<size_t>(in.gcount()), crc);
  }
  if (in.bad()) throw std::runtime_error("error reading training.data '" + path + "'");
  return crc;
}

}  // namespace

nlohmann::json data_identity(const TrainingConfig& t, const std::optional<CorpusIdentity>& tokens) {
  nlohmann::json j = {{"seed", t.seed}, {"batch_size", t.batch_size}, {"seq_len", t.seq_len}};
  if (tokens) {
    j["corpus"] = to_json(*tokens);  // every file's size and CRC-32C, the format, the separators
    j["tokenizer"] = tokens->tokenizer;
  } else if (t.data.empty()) {
    j["corpus"] = "synthetic";
    j["tokenizer"] = kSyntheticTokens;
  } else {
    j["corpus"] = absolute(t.data);
    j["bytes"] = compat::file_size(t.data);
    j["crc32c"] = crc32c_hex(file_crc32c(t.data));
    j["tokenizer"] = kWordTokenizer;
  }
  return j;
}

std::vector<std::string> data_mismatches(const nlohmann::json& saved, const nlohmann::json& job) {
  static const std::vector<std::pair<const char*, const char*>> keys = {{"corpus", "training.data"},
                                                                        {"bytes", "training.data (size in bytes)"},
                                                                        {"crc32c", "training.data (content CRC-32C)"},
                                                                        {"tokenizer", "tokenizer"},
                                                                        {"seed", "training.seed"},
                                                                        {"batch_size", "training.batch_size"},
                                                                        {"seq_len", "training.seq_len"}};
  auto text = [](const nlohmann::json& j, const char* key) {
    const auto it = j.find(key);
    return it == j.end() ? std::string("(none)") : it->dump();
  };
  std::vector<std::string> out;
  for (const auto& [key, name] : keys) {
    const std::string a = text(saved, key), b = text(job, key);
    if (a != b) out.push_back(std::string(name) + ": checkpoint " + a + ", this job " + b);
  }
  return out;
}

}  // namespace hyper_parallel::train
