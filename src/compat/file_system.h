// Files and folders without std::filesystem.
//
// The torch wheels link parts of a newer libstdc++ into libtorch_cpu.so and export them,
// std::filesystem among them (141 symbols in 2.11, 101 in 2.15). A program linked to
// LibTorch then binds its own std::filesystem calls to LibTorch's private copy, built by
// another compiler: with g++ 13 and torch 2.11 that copy disagrees with the inline parts
// and every test touching a folder crashed. So this project uses these POSIX-based helpers,
// and a test checks that no binary of ours references std::filesystem.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hyper_parallel::compat {

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
// Size in bytes of a regular file; -1 when it does not exist.
int64_t file_size(const std::string& path);
// mkdir -p. Returns false (and the reason in *error) when it cannot.
bool create_directories(const std::string& path, std::string* error = nullptr);
// rm -rf; a missing path is fine.
void remove_all(const std::string& path);
// Names in a folder (no "." or ".."), sorted; empty when it cannot be read.
std::vector<std::string> list_directory(const std::string& path);
// Paths below a folder, relative to it, depth first, sorted per folder.
std::vector<std::string> list_directory_recursive(const std::string& path);
std::string join_path(const std::string& a, const std::string& b);
// "a/b/c" -> "a/b"; "c" -> ""; "/c" -> "/".
std::string parent_path(const std::string& path);
// The process's working directory, which relative paths are read from.
std::string current_directory();
// $TMPDIR, else /tmp.
std::string temp_directory();

}  // namespace hyper_parallel::compat
