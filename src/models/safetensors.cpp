#include "models/safetensors.h"

#include <sys/mman.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "io/mapped_file.h"

namespace hyper_parallel::hf {

namespace {

// The reference implementation refuses larger headers (a forged length must not make us
// allocate gigabytes).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw std::runtime_error("safetensors file " + file + ": " + what);
}

}  // namespace

namespace {

// The dtypes read and written here, by their names in the format.
const std::vector<std::pair<std::string, c10::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<std::string, c10::ScalarType>> table = {
      {"F64", c10::kDouble}, {"F32", c10::kFloat}, {"F16", c10::kHalf}, {"BF16", c10::kBFloat16}, {"I64", c10::kLong},
      {"I32", c10::kInt},    {"I16", c10::kShort}, {"I8", c10::kChar},  {"U8", c10::kByte},       {"BOOL", c10::kBool},
  };
  return table;
}

}  // namespace

c10::ScalarType safetensors_dtype(const std::string& name) {
  for (const auto& [n, t] : dtype_table()) {
    if (n == name) return t;
  }
  throw std::runtime_error("unknown or unsupported dtype \"" + name +
                           "\" (read: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
}

std::string safetensors_dtype_name(c10::ScalarType type) {
  for (const auto& [n, t] : dtype_table()) {
    if (t == type) return n;
  }
  throw std::invalid_argument(std::string("dtype ") + c10::toString(type) +
                              " has no safetensors name here (F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
}

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, uint64_t file_size,
                                           const std::string& file) {
  if (size < 8 || file_size < 8) {
    fail(file, "is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian, whatever the host
  if (n > kMaxHeaderBytes) fail(file, "header length " + std::to_string(n) + " exceeds the format's limit of 100 MB");
  if (8 + n > file_size || 8 + n > size) {
    fail(file, "truncated: the header claims " + std::to_string(n) + " bytes, the file has " +
                   std::to_string(file_size - 8) + " after the length");
  }
  SafetensorsHeader h;
  h.data_start = 8 + n;
  const uint64_t data_size = file_size - h.data_start;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes + 8, bytes + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    fail(file, std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(file, "header is not a JSON object");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail(file, "__metadata__ is not an object of strings");
      for (const auto& [key, value] : v.items()) {
        if (!value.is_string()) fail(file, "__metadata__." + key + " is not a string");
        h.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      fail(file, where + "expected an object with dtype, shape and data_offsets");
    }
    const auto& dt = v.at("dtype");
    const auto& shape = v.at("shape");
    const auto& offsets = v.at("data_offsets");
    if (!dt.is_string()) fail(file, where + "dtype is not a string");
    SafetensorsEntry e;
    e.dtype_name = dt.get<std::string>();
    try {
      e.dtype = safetensors_dtype(e.dtype_name);
    } catch (const std::runtime_error& err) {
      fail(file, where + err.what());
    }
    if (!shape.is_array()) fail(file, where + "shape is not an array");
    // Element count, refusing overflow: a forged shape must not wrap around to a small size.
    uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned())
        fail(file, where + "shape " + shape.dump() + " has a dimension that is not a non-negative integer");
      const uint64_t s = d.get<uint64_t>();
      if (s > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (s != 0 && numel > std::numeric_limits<uint64_t>::max() / s)) {
        fail(file, where + "shape " + shape.dump() + " is too large");
      }
      numel *= s;
      e.shape.push_back(static_cast<int64_t>(s));
    }
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      fail(file, where + "data_offsets " + offsets.dump() + " is not [begin, end]");
    }
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    if (e.begin > e.end) fail(file, where + "data_offsets " + offsets.dump() + " has begin > end");
    if (e.end > data_size) {
      fail(file, where + "data_offsets " + offsets.dump() + " run past the end of the file (" +
                     std::to_string(data_size) + " data bytes): truncated?");
    }
    const uint64_t item = c10::elementSize(e.dtype);
    if (numel > std::numeric_limits<uint64_t>::max() / item || numel * item != e.end - e.begin) {
      fail(file, where + shape.dump() + " " + e.dtype_name + " needs " +
                     (numel > std::numeric_limits<uint64_t>::max() / item ? std::string("more than 2^64")
                                                                          : std::to_string(numel * item)) +
                     " bytes, data_offsets " + offsets.dump() + " hold " + std::to_string(e.end - e.begin));
    }
    ranges.emplace_back(e.begin, e.end);
    h.tensors.emplace(name, std::move(e));
  }
  // The specification: the data section is entirely indexed, without holes or overlaps.
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& [b, e] : ranges) {
    if (b != at) {
      fail(file, std::string(b < at ? "tensors overlap" : "the data has a hole") + " at byte " +
                     std::to_string(std::min(b, at)) + " of the data section");
    }
    at = e;
  }
  if (at != data_size) {
    fail(file, "the tensors cover " + std::to_string(at) + " of the " + std::to_string(data_size) +
                   " data bytes (trailing bytes)");
  }
  return h;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  try {
    file_ = std::make_unique<const io::MappedFile>(path);
  } catch (const c10::Error& e) {
    fail(path, e.what_without_backtrace());  // "cannot open '<path>': <reason>"
  }
  base_ = file_->data();
  size_ = static_cast<uint64_t>(file_->size());
  header_ = parse_safetensors_header(base_, size_, size_, path);
}

SafetensorsFile::~SafetensorsFile() = default;

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = header_.tensors.find(name);
  if (it == header_.tensors.end()) fail(path_, "has no tensor '" + name + "'");
  return it->second;
}

void SafetensorsFile::release(const SafetensorsEntry& e) const {
  // Whole pages inside the tensor's bytes only (a neighbour may share the edge pages).
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t first = header_.data_start + e.begin, last = header_.data_start + e.end;
  const uint64_t b = (first + page - 1) / page * page, end = last / page * page;
  if (end > b) ::madvise(const_cast<uint8_t*>(base_) + b, end - b, MADV_DONTNEED);
}

}  // namespace hyper_parallel::hf
