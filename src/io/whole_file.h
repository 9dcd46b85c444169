// whole_file.h — files read whole, and written whole or not at all.
//
// A file is written to "<path>.tmp-<pid>" beside its target, fsync'ed, renamed over the
// target and the folder fsync'ed, so a crash, a kill or a full disk leaves under the name
// either the old complete file or the new one, never a truncated one; an error or an
// exception removes the temporary file. Checkpoints, their manifests and `latest` markers,
// safetensors files and exported configs are all written this way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace hyper_parallel::io {

class AtomicFile {
 public:
  // Creates the temporary file; std::runtime_error naming `path` and the OS reason when
  // it cannot (a missing folder, a file where the folder should be, no permission).
  explicit AtomicFile(std::string path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // removes the temporary file unless committed

  // Never throws and always reports every byte as written: it also runs as a callback
  // inside LibTorch's zip writer (C code that must not be unwound through, and whose
  // destructor fails an assertion on a short count). The first error is kept for
  // commit() and later data is dropped.
  size_t write(const void* data, size_t size) noexcept;
  void write(std::string_view bytes) noexcept { write(bytes.data(), bytes.size()); }

  int error() const { return error_; }  // errno of the first failed write, 0 when none
  int64_t bytes_written() const { return bytes_; }
  uint32_t crc32c() const { return crc_; }  // CRC-32C of every byte written
  const std::string& path() const { return path_; }

  // fsync, close, `before_rename` (a fault-injection point, when given), rename over the
  // target, fsync of the folder. std::runtime_error naming the path and the OS reason
  // ("No space left on device") on any failure, the first write error included.
  void commit(const std::function<void()>& before_rename = nullptr);

 private:
  std::string path_, temp_path_;
  int fd_ = -1;
  int error_ = 0;
  bool committed_ = false;
  uint32_t crc_ = 0;
  int64_t bytes_ = 0;
};

// `bytes` as the whole file at `path`, atomically; errors as AtomicFile's.
void write_file_atomically(const std::string& path, std::string_view bytes);

// The whole file as bytes; std::runtime_error naming it and the OS reason.
std::string read_whole_file(const std::string& path);

// fsync of `folder` ("" is the current one): makes the renames in it durable, not only the
// data renamed. Best effort (a folder that cannot be opened is left as it is).
void sync_folder(const std::string& folder);

// Whether `name` is an AtomicFile's temporary file ("<name>.tmp-<digits>"): what a crashed
// writer leaves behind.
bool is_temp_file_name(const std::string& name);

}  // namespace hyper_parallel::io
