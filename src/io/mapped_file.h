// A whole file mapped read-only into memory: the bytes stay in the page cache (shared by
// every rank on the machine, paged in as they are read, evictable), so reading a corpus
// far larger than RAM costs only the pages actually touched. Corpora and safetensors files
// are read this way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hyper_parallel::io {

class MappedFile {
 public:
  // Throws c10::Error naming `path` and the OS reason when it cannot be opened or mapped.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  // The file's bytes (nullptr for an empty file).
  const unsigned char* data() const { return data_; }

 private:
  std::string path_;
  int64_t size_ = 0;
  const unsigned char* data_ = nullptr;
};

}  // namespace hyper_parallel::io
