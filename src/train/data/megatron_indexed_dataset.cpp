// Megatron .idx reading: every field is checked before it is used, so a truncated or
// foreign file is an error naming the field, never an out-of-bounds read.
#include "train/data/megatron_indexed_dataset.h"

#include <c10/util/Exception.h>

#include <cstring>

#include "io/mapped_file.h"

namespace hyper_parallel::train {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <class T>
T read_le(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Megatron's DType codes (indexed_dataset.py); floats are not token ids.
bool dtype_from_code(uint8_t code, TokenDtype* dtype) {
  switch (code) {
    case 1:
      *dtype = TokenDtype::kUInt8;
      return true;
    case 2:
      *dtype = TokenDtype::kInt8;
      return true;
    case 3:
      *dtype = TokenDtype::kInt16;
      return true;
    case 4:
      *dtype = TokenDtype::kInt32;
      return true;
    case 5:
      *dtype = TokenDtype::kInt64;
      return true;
    case 8:
      *dtype = TokenDtype::kUInt16;
      return true;
    default:
      return false;
  }
}

}  // namespace

MegatronIndex parse_megatron_index(const unsigned char* data, int64_t size, int64_t bin_bytes,
                                   const std::string& what) {
  TORCH_CHECK(size >= kHeaderBytes, "Megatron index '", what, "' has ", size, " bytes, fewer than its ", kHeaderBytes,
              "-byte header: truncated or not an .idx file");
  TORCH_CHECK(std::memcmp(data, kMagic, sizeof kMagic) == 0, "Megatron index '", what,
              "': magic is not \"MMIDIDX\\0\\0\" (not a Megatron indexed dataset .idx)");
  const auto version = read_le<uint64_t>(data + 9);
  TORCH_CHECK(version == 1, "Megatron index '", what, "': version is ", version, ", only version 1 is known");
  const uint8_t code = data[17];
  MegatronIndex index;
  TORCH_CHECK(dtype_from_code(code, &index.dtype), "Megatron index '", what, "': dtype code ", int(code),
              code == 6 || code == 7 ? " is a floating-point type, not token ids"
                                     : " is not one of Megatron's codes (1 uint8, 2 int8, 3 int16, 4 int32, "
                                       "5 int64, 8 uint16)");
  const auto s = read_le<uint64_t>(data + 18);
  const auto d = read_le<uint64_t>(data + 26);
  // Bounded before any product, so the size arithmetic below cannot overflow.
  const auto limit = static_cast<uint64_t>(size);
  TORCH_CHECK(s <= limit && d <= limit, "Megatron index '", what, "': sequence count ", s, " / document count ", d,
              " cannot fit in a file of ", size, " bytes");
  const int64_t S = static_cast<int64_t>(s), D = static_cast<int64_t>(d);
  const int64_t expected = kHeaderBytes + 4 * S + 8 * S + 8 * D;
  TORCH_CHECK(size != expected + S || S == 0, "Megatron index '", what,
              "' has per-sequence modes (a multimodal dataset): only token datasets are supported");
  TORCH_CHECK(size == expected, "Megatron index '", what, "' has ", size, " bytes, but sequence count ", S,
              " and document count ", D, " need ", expected, " (34 + 12 x sequences + 8 x documents)");
  TORCH_CHECK(D >= 1, "Megatron index '", what, "': document count is 0; it must be at least 1 (the leading 0)");
  index.sequences = S;

  const unsigned char* lengths = data + kHeaderBytes;
  const unsigned char* pointers = lengths + 4 * S;
  const unsigned char* docs = pointers + 8 * S;
  const int64_t item = token_dtype_size(index.dtype);
  // Token offset of each sequence; pointers must be the running sum Megatron writes.
  std::vector<int64_t> first_token(static_cast<size_t>(S) + 1, 0);
  int64_t bytes = 0;
  for (int64_t i = 0; i < S; ++i) {
    const auto len = read_le<int32_t>(lengths + 4 * i);
    const auto ptr = read_le<int64_t>(pointers + 8 * i);
    TORCH_CHECK(len >= 0, "Megatron index '", what, "': sequence_lengths[", i, "] = ", len, " is negative");
    TORCH_CHECK(ptr == bytes, "Megatron index '", what, "': sequence_pointers[", i, "] = ", ptr, ", expected ", bytes,
                " (the byte sum of the lengths before it, as Megatron writes)");
    TORCH_CHECK(bytes + int64_t{len} * item <= bin_bytes, "Megatron index '", what, "': sequence ", i, " ends at byte ",
                bytes + int64_t{len} * item, ", past the end of the .bin file (", bin_bytes, " bytes)");
    first_token[static_cast<size_t>(i)] = bytes / item;
    bytes += int64_t{len} * item;
  }
  first_token[static_cast<size_t>(S)] = bytes / item;
  TORCH_CHECK(bytes == bin_bytes, "Megatron index '", what, "': its sequences hold ", bytes,
              " bytes of tokens, but the .bin file has ", bin_bytes);

  index.document_token_starts.reserve(static_cast<size_t>(D));
  int64_t previous = 0;
  for (int64_t k = 0; k < D; ++k) {
    const auto idx = read_le<int64_t>(docs + 8 * k);
    TORCH_CHECK(k > 0 || idx == 0, "Megatron index '", what, "': document_indices[0] = ", idx, ", expected 0");
    TORCH_CHECK(idx >= previous && idx <= S, "Megatron index '", what, "': document_indices[", k, "] = ", idx,
                " is not in [", previous, ", ", S, "] (non-decreasing sequence indices)");
    previous = idx;
    index.document_token_starts.push_back(first_token[static_cast<size_t>(idx)]);
  }
  TORCH_CHECK(previous == S, "Megatron index '", what, "': the last document index is ", previous,
              ", expected the sequence count ", S, " (every sequence in a document)");
  return index;
}

std::shared_ptr<const TokenDocuments> open_megatron_dataset(const std::string& prefix, DocumentSeparators separators,
                                                            int64_t vocab_size) {
  auto bin = std::make_shared<const io::MappedFile>(prefix + ".bin");
  MegatronIndex index;
  {
    const io::MappedFile idx(prefix + ".idx");
    index = parse_megatron_index(idx.data(), idx.size(), bin->size(), idx.path());
  }
  TORCH_CHECK(index.document_token_starts.back() > 0, "Megatron dataset '", prefix, "' holds no tokens");
  return std::make_shared<const TokenDocuments>(std::move(bin), index.dtype, std::move(index.document_token_starts),
                                                separators, vocab_size);
}

}  // namespace hyper_parallel::train
