// checkpoint_io.h — the on-disk files behind `hp-train` checkpoints.
//
// Every rank writes its own file: named plain CPU tensors (its local shards,
// optimizer state, RNG states) plus a JSON metadata string, serialized with
// LibTorch's own archive format, and the CRC-32C of every tensor's bytes, checked
// on every read (a flipped byte is an error naming the file and the tensor, never
// silently different weights). Files and the `latest` marker are written
// atomically (temporary file, fsync, rename, fsync of the directory), so a
// crash at any point leaves either the old complete file or the new complete
// file under the final name, never a truncated one.
//
// Layout of a checkpoint folder:
//   <folder>/step-<N>/...   one directory per saved step (contents: caller's choice;
//                           the trainer's are described in checkpoint_manifest.h)
//   <folder>/latest         text file holding N, the last completely saved step
// A crash leaves "<name>.tmp-<pid>" files behind; remove_temp_files deletes them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hyper_parallel::train {

// Size and CRC-32C of a whole file, as the step manifest records them.
struct FileChecksum {
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

// Writes `tensors` and `metadata_json` to `path`, atomically: the data goes to
// "<path>.tmp-<pid>", which is fsync'ed and renamed over `path`. Tensors are
// stored as contiguous CPU copies (views, non-contiguous and device tensors are
// accepted; autograd history is dropped). The parent directory must exist.
// Throws std::invalid_argument for an undefined tensor and std::runtime_error
// naming the file and the OS reason (e.g. "No space left on device") on any I/O
// failure; no temporary file is left behind. Returns what was written.
// `crash_label` names the HP_CRASH_AT point "<crash_label>.before_rename"
// (fault_injection.h) between the synced temporary file and the rename.
FileChecksum write_tensor_file(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                               const std::string& metadata_json, const std::string& crash_label = "tensor_file",
                               int64_t rank = 0);

// What write_tensor_file stored, bit for bit (dtype, shape and values).
struct TensorFile {
  std::map<std::string, at::Tensor> tensors;  // CPU, contiguous
  std::string metadata_json;
};

// Reads a file written by write_tensor_file onto the CPU. Throws
// std::runtime_error naming `path` when it is missing, unreadable, truncated,
// corrupt (a tensor whose bytes do not match its stored CRC-32C is named) or not
// a tensor file of this format.
// Only for files whose bytes are known to be what was written (the trainer checks the
// whole file's CRC-32C against the step manifest first): LibTorch's archive reader can
// give tensors larger than their buffer on a forged archive.
TensorFile read_tensor_file(const std::string& path);

// Size and CRC-32C of the file at `path`; std::runtime_error naming it and the OS
// reason when it cannot be read.
FileChecksum checksum_file(const std::string& path);

// Writes `text` to `path` atomically (io/whole_file.h), with the crash point
// "<crash_label>.before_rename" (fault_injection.h) before the rename.
void write_checkpoint_file(const std::string& path, const std::string& text, const std::string& crash_label,
                           int64_t rank = 0);

// Deletes the "<name>.tmp-<pid>" files a crashed or failed save left in `folder`
// and its direct subdirectories (the step folders); returns their paths.
std::vector<std::string> remove_temp_files(const std::string& folder);

// "<folder>/step-<step>".
std::string step_directory(const std::string& folder, int64_t step);

// Replaces <folder>/latest with `step` atomically. Write it only after every
// file of that step is complete, so that the marker always names a usable step.
void write_latest_marker(const std::string& folder, int64_t step, int64_t rank = 0);

// The step named by <folder>/latest, or nullopt when there is no marker (no
// checkpoint yet). Throws std::runtime_error naming the file when it exists but
// does not hold a step number: silently starting over would overwrite a run.
std::optional<int64_t> read_latest_marker(const std::string& folder);

// mkdir -p; throws std::runtime_error naming `path` on failure.
void make_directories(const std::string& path);

}  // namespace hyper_parallel::train
