// Megatron-LM's indexed dataset: PREFIX.bin holds every sequence's token ids back to back;
// PREFIX.idx describes them. The .idx layout (megatron/core/datasets/indexed_dataset.py,
// _IndexWriter / _IndexReader), all little-endian:
//   9 bytes   magic "MMIDIDX\0\0"
//   u64       version, 1
//   u8        dtype code of the tokens: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
//             6 float64, 7 float32, 8 uint16 (Megatron writes uint16 below 65500 ids, else int32)
//   u64       S, the sequence count
//   u64       D, the document-index count (documents + 1)
//   i32[S]    sequence lengths, in tokens
//   i64[S]    sequence pointers, byte offsets into .bin
//   i64[D]    document indices: 0, then the sequence index where each document ends
//   (i8[S]    sequence modes, multimodal datasets only: refused here)
// A document is the sequences [doc[k], doc[k + 1]).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/data/token_documents.h"

namespace hyper_parallel::train {

struct MegatronIndex {
  TokenDtype dtype = TokenDtype::kInt32;
  int64_t sequences = 0;
  // Per document, its first token in .bin; one more entry, the token count.
  std::vector<int64_t> document_token_starts;
};

// Parses and checks an .idx image: magic, version, dtype code (integer types only), the
// counts against the image size, lengths >= 0, pointers equal to the running byte sum of
// the lengths (what Megatron's writer produces) with the last sequence ending exactly at
// `bin_bytes`, document indices starting at 0, non-decreasing, ending at S. Throws
// c10::Error naming `what` (the file) and the field.
MegatronIndex parse_megatron_index(const unsigned char* data, int64_t size, int64_t bin_bytes, const std::string& what);

// PREFIX.idx and PREFIX.bin as documents, separated as TokenDocuments says.
std::shared_ptr<const TokenDocuments> open_megatron_dataset(const std::string& prefix, DocumentSeparators separators,
                                                            int64_t vocab_size);

}  // namespace hyper_parallel::train
