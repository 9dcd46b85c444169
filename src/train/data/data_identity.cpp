// data_identity.cpp — see data_identity.h.
#include "train/data/data_identity.h"

#include <climits>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

#include "compat/file_system.h"
#include "io/crc32c.h"

namespace hyper_parallel::train {
namespace {

// How batches.h turns each corpus into token ids; a new rule must get a new name.
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
    crc = io::crc32c(block.data(), static_cast<size_t>(in.gcount()), crc);
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
    j["crc32c"] = io::crc32c_hex(file_crc32c(t.data));
    j["tokenizer"] = kWordTokenizer;
  }
  return j;
}

namespace {

// The record of the corpus with every path taken out: what the bytes are, not where.
nlohmann::json without_paths(const nlohmann::json& data) {
  nlohmann::json out = data;
  auto corpus = out.find("corpus");
  if (corpus == out.end()) return out;
  if (corpus->is_string() && *corpus != "synthetic") {
    *corpus = "(a text file)";  // its size and CRC-32C are fields of their own
  } else if (corpus->is_object() && corpus->contains("files")) {
    for (auto& file : corpus->at("files")) file.erase("path");
  }
  return out;
}

std::string paths_of(const nlohmann::json& data) {
  const auto corpus = data.find("corpus");
  if (corpus == data.end()) return "(none)";
  if (!corpus->is_object()) return corpus->dump();
  std::string out;
  for (const auto& file : corpus->value("files", nlohmann::json::array())) {
    out += (out.empty() ? "" : ", ") + file.value("path", std::string("?"));
  }
  return out;
}

}  // namespace

std::vector<std::string> data_mismatches(const nlohmann::json& saved_record, const nlohmann::json& job_record) {
  static const std::vector<std::pair<const char*, const char*>> keys = {{"corpus", "training.data"},
                                                                        {"bytes", "training.data (size in bytes)"},
                                                                        {"crc32c", "training.data (content CRC-32C)"},
                                                                        {"tokenizer", "tokenizer"},
                                                                        {"seed", "training.seed"},
                                                                        {"batch_size", "training.batch_size"},
                                                                        {"seq_len", "training.seq_len"}};
  // Where the corpus lives is not what it is (data_moved says so instead).
  const nlohmann::json saved = without_paths(saved_record), job = without_paths(job_record);
  auto text = [](const nlohmann::json& j, const char* key) {
    const auto it = j.find(key);
    return it == j.end() ? std::string("(none)") : it->dump();
  };
  std::vector<std::string> out;
  for (const auto& [key, name] : keys) {
    if (text(saved, key) == text(job, key)) continue;
    // What differs is shown as recorded, paths included.
    const std::string a = text(saved_record, key), b = text(job_record, key);
    const auto sa = saved_record.find(key), sb = job_record.find(key);
    if (sa != saved_record.end() && sb != job_record.end() && sa->is_object() && sb->is_object()) {
      // A pre-tokenized corpus: the fields that differ, not the whole records.
      for (const auto& [field, value] : sa->items()) {
        const std::string theirs = sb->contains(field) ? sb->at(field).dump() : "(none)";
        if (value.dump() != theirs) {
          out.push_back(std::string(name) + " (" + field + "): checkpoint " + value.dump() + ", this job " + theirs);
        }
      }
      for (const auto& [field, value] : sb->items()) {
        if (!sa->contains(field))
          out.push_back(std::string(name) + " (" + field + "): checkpoint (none), this job " + value.dump());
      }
    } else {
      out.push_back(std::string(name) + ": checkpoint " + a + ", this job " + b);
    }
  }
  return out;
}

std::optional<std::string> data_moved(const nlohmann::json& saved, const nlohmann::json& job) {
  const std::string from = paths_of(saved), to = paths_of(job);
  if (from == to || without_paths(saved) != without_paths(job)) return std::nullopt;
  return "training.data moved from " + from + " to " + to +
         ": the same bytes (every file's size and CRC-32C), so the checkpoint's data is read from the new place";
}

}  // namespace hyper_parallel::train
