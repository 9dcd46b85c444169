// CorpusIdentity: CRC-32C over the mapped file, JSON with fixed key names.
#include "train/data/corpus_identity.h"

#include "io/crc32c.h"
#include "io/mapped_file.h"

namespace hyper_parallel::train {

FileIdentity identify_file(const std::string& path) {
  const io::MappedFile file(path);
  FileIdentity id;
  id.path = path;
  id.bytes = file.size();
  id.crc32c = file.size() > 0 ? io::crc32c(file.data(), static_cast<size_t>(file.size())) : 0;
  return id;
}

nlohmann::json to_json(const CorpusIdentity& id) {
  nlohmann::json files = nlohmann::json::array();
  for (const FileIdentity& f : id.files) {
    files.push_back({{"path", f.path}, {"bytes", f.bytes}, {"crc32c", io::crc32c_hex(f.crc32c)}});
  }
  return {{"format", id.format},       {"files", files},
          {"tokenizer", id.tokenizer}, {"tokenizer_sha256", id.tokenizer_sha256},
          {"dtype", id.dtype},         {"vocab_size", id.vocab_size},
          {"eos_id", id.eos_id},       {"bos_id", id.bos_id},
          {"tokens", id.tokens},       {"documents", id.documents}};
}

}  // namespace hyper_parallel::train
