// checkpoint_io.h — the on-disk files behind `hp-train` checkpoints.
//
// Every rank writes its own file: named plain CPU tensors (its local shards,
// optimizer state, RNG states) plus a JSON metadata string, serialized with
// LibTorch's own archive format. Files and the `latest` marker are written
// atomically (temporary file, fsync, rename, fsync of the directory), so a
// crash at any point leaves either the old complete file or the new complete
// file under the final name, never a truncated one.
//
// Layout of a checkpoint folder:
//   <folder>/step-<N>/...   one directory per saved step (contents: caller's choice)
//   <folder>/latest         text file holding N, the last completely saved step
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace hyper_parallel::train {

// Writes `tensors` and `metadata_json` to `path`, atomically: the data goes to
// "<path>.tmp-<pid>", which is fsync'ed and renamed over `path`. Tensors are
// stored as contiguous CPU copies (views, non-contiguous and device tensors are
// accepted; autograd history is dropped). The parent directory must exist.
// Throws std::invalid_argument for an undefined tensor and std::runtime_error
// naming the file on any I/O failure; no temporary file is left behind.
void write_tensor_file(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::string& metadata_json);

// What write_tensor_file stored, bit for bit (dtype, shape and values).
struct TensorFile {
  std::map<std::string, at::Tensor> tensors;  // CPU, contiguous
  std::string metadata_json;
};

// Reads a file written by write_tensor_file onto the CPU. Throws
// std::runtime_error naming `path` when it is missing, unreadable, truncated,
// corrupt or not a tensor file of this format.
TensorFile read_tensor_file(const std::string& path);

// "<folder>/step-<step>".
std::string step_directory(const std::string& folder, int64_t step);

// Replaces <folder>/latest with `step` atomically. Write it only after every
// file of that step is complete, so that the marker always names a usable step.
void write_latest_marker(const std::string& folder, int64_t step);

// The step named by <folder>/latest, or nullopt when there is no marker (no
// checkpoint yet). Throws std::runtime_error naming the file when it exists but
// does not hold a step number: silently starting over would overwrite a run.
std::optional<int64_t> read_latest_marker(const std::string& folder);

// mkdir -p; throws std::runtime_error naming `path` on failure.
void make_directories(const std::string& path);

}  // namespace hyper_parallel::train
