// crc32c.h — CRC-32C (Castagnoli), the checksum of checkpoint tensors, files and corpora.
//
// Our own table-driven code (no new dependency): it detects every burst error up to
// 32 bits and almost all others, which is what a flipped or replaced byte in a file
// needs. Not a cryptographic hash; it guards against accidents, not attackers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hyper_parallel::io {

// CRC-32C of `size` bytes, continuing from `crc` (the result of an earlier call on the
// bytes before; 0 to start): crc32c(b, n) == crc32c(b + k, n - k, crc32c(b, k)).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// Eight lowercase hex digits, the form stored in checkpoint metadata.
std::string crc32c_hex(uint32_t crc);

}  // namespace hyper_parallel::io
