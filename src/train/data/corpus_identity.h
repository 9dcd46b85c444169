// What a run trained on, precisely enough to tell whether a resumed run reads the same
// data: the format, every file with its size and CRC-32C, and the token semantics
// (tokenizer, vocabulary, separators). A checkpoint can record it and compare on resume.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hyper_parallel::train {

struct FileIdentity {
  std::string path;
  int64_t bytes = 0;
  uint32_t crc32c = 0;  // of the whole content
  bool operator==(const FileIdentity&) const = default;
};

struct CorpusIdentity {
  std::string format;  // synthetic | text | bin_u16 | bin_u32 | megatron
  std::vector<FileIdentity> files;
  std::string tokenizer;         // the sidecar's; "" when unknown
  std::string tokenizer_sha256;  // the sidecar's; "" when unknown
  std::string dtype;             // stored token dtype; "" for synthetic / text
  int64_t vocab_size = -1;       // ids are < this
  int64_t eos_id = -1;           // separators between documents; -1: none
  int64_t bos_id = -1;
  int64_t tokens = -1;     // of the stream read (separators included)
  int64_t documents = -1;  // -1 when the format records none
  bool operator==(const CorpusIdentity&) const = default;
};

// Reads the whole file once (about 1 GB/s from the page cache with this CRC).
FileIdentity identify_file(const std::string& path);

nlohmann::json to_json(const CorpusIdentity& id);

}  // namespace hyper_parallel::train
