// safetensors, read from its specification (safetensors_writer.h writes it) (huggingface/safetensors, "Format"): 8
// bytes little-endian header length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end)}} plus an
// optional "__metadata__" string map, then the data; offsets are relative to byte 8 + N. No alignment is assumed.
//
// A file is memory-mapped: a tensor's bytes are read in place, and a rank copies only the
// rows/columns of its own shard (the pages of the rest are never touched), then hands the
// pages back (release) so that loading never holds the whole checkpoint.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hyper_parallel::io {
class MappedFile;
}  // namespace hyper_parallel::io

namespace hyper_parallel::hf {

// A Hugging Face checkpoint folder holds one of these: a single file, or shards and this index.
inline constexpr const char* kSingleFile = "model.safetensors";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";

struct SafetensorsEntry {
  std::string dtype_name;  // as written ("BF16")
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the data section
};

struct SafetensorsHeader {
  uint64_t data_start = 0;  // 8 + N
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
};

// Parses and checks a header against a file of `file_size` bytes whose first `size` bytes
// are `bytes` (size >= min(file_size, 8 + N) suffices). Throws std::runtime_error naming
// `file` (and the tensor) for: a file shorter than its header, a header that is not a JSON
// object, an entry without dtype/shape/data_offsets, an unknown dtype, offsets that run
// past the file, overlap or leave holes, or a byte count that does not match the shape.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, uint64_t file_size,
                                           const std::string& file);

// One memory-mapped safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // Throws naming the file when it has no tensor `name`.
  const SafetensorsEntry& entry(const std::string& name) const;
  // The first byte of a tensor's data (inside the mapping; not aligned in general).
  const uint8_t* data(const SafetensorsEntry& e) const { return base_ + header_.data_start + e.begin; }
  // Drops the tensor's pages from this process (they are read again from the file if needed).
  void release(const SafetensorsEntry& e) const;

 private:
  std::string path_;
  std::unique_ptr<const io::MappedFile> file_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  SafetensorsHeader header_;
};

// The ATen type of a safetensors dtype name; throws naming it for one we do not read.
c10::ScalarType safetensors_dtype(const std::string& name);
// And back ("BF16"); throws std::invalid_argument naming a dtype the format has no name for here.
std::string safetensors_dtype_name(c10::ScalarType type);

}  // namespace hyper_parallel::hf
