// safetensors, written from its specification (huggingface/safetensors, "Format"); the
// reader (safetensors.h) and Python's safetensors.torch.load_file read it back.
//
// Layout as the reference implementation writes it: 8 bytes little-endian header length N,
// N bytes of JSON — "__metadata__" first, then one entry per tensor in data order — padded
// with spaces to a multiple of 8 bytes, then the tensors' bytes back to back. Tensors are
// ordered by element size (largest first), then by name, so that each starts aligned to its
// element size; the same tensors always give the same bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace hyper_parallel::hf {

// Writes `tensors` (any device, layout or stride: stored as contiguous CPU copies,
// little-endian) as one safetensors file, atomically (io/whole_file.h). Throws
// std::invalid_argument for an undefined tensor, a dtype without a safetensors name or a name
// of "__metadata__", std::runtime_error naming the file and the OS reason when it cannot be
// written.
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace hyper_parallel::hf
