// storage_checks.h — the folders a job writes, checked when it starts rather than at its
// first save (after a whole checkpoint interval of training).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace hyper_parallel::train {

// Creates `folder` (mkdir -p), then creates and removes a probe file in it. Throws
// std::runtime_error naming `key` (the config key of the folder), the folder and the OS
// reason when it cannot. `tag` keeps concurrent probes (ranks as threads) apart.
void check_writable_folder(const std::string& folder, const std::string& key, const std::string& tag);

// Bytes free for this user on the file system of `folder`; nullopt when unknown.
std::optional<int64_t> free_bytes(const std::string& folder);

// A warning when `free` bytes cannot hold `needed` (one checkpoint); nullopt otherwise.
std::optional<std::string> room_warning(const std::string& folder, int64_t free, int64_t needed);

}  // namespace hyper_parallel::train
