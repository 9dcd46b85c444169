// checkpoint_io.cpp — atomic per-rank tensor files and the `latest` marker.
//
// A tensor file is a LibTorch archive (the zip format of torch::save) holding
// four attributes: "hp_format" (a tag so that a foreign archive is rejected
// clearly), "metadata" (the JSON string), "tensors" (a Dict[str, Tensor]) and
// "checksums" (a Dict[str, int]: the CRC-32C of each tensor's bytes, because
// LibTorch's reader does not check the zip CRCs and loads flipped bytes).
// A dict rather than one archive key per tensor because archive keys become
// TorchScript attribute names, and parameter names such as "layers.0.weight"
// are not valid attribute names.
#include "train/checkpoint/checkpoint_io.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "compat/file_system.h"
#include "io/crc32c.h"
#include "io/errno_text.h"
#include "io/whole_file.h"
#include "train/checkpoint/fault_injection.h"

namespace hyper_parallel::train {
namespace {

constexpr const char* kFormatKey = "hp_format";
constexpr const char* kFormatTag = "hyper_parallel.tensor_file.v2";
constexpr const char* kFormatTagV1 = "hyper_parallel.tensor_file.v1";
constexpr const char* kMetadataKey = "metadata";
constexpr const char* kTensorsKey = "tensors";
constexpr const char* kChecksumsKey = "checksums";

// A tensor read from a damaged or forged archive may claim more elements than its storage
// holds; touching its data would read past the buffer.
void check_fits_storage(const std::string& name, const at::Tensor& t) {
  for (int64_t s : t.strides()) {
    if (s < 0) throw std::runtime_error("tensor '" + name + "' has a negative stride");
  }
  const size_t needed = at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.element_size(),
                                                         static_cast<size_t>(t.storage_offset()));
  const size_t held = t.storage().nbytes();
  if (needed > held) {
    throw std::runtime_error("tensor '" + name + "' needs " + std::to_string(needed) + " bytes but its storage holds " +
                             std::to_string(held) + " (the file is corrupt)");
  }
}

uint32_t tensor_crc(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return io::crc32c(c.data_ptr(), c.nbytes());
}

// c10::Error's what() carries a C++ backtrace; the first line is the message.
std::string short_message(const std::exception& e) {
  std::string msg;
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    msg = c10_error->what_without_backtrace();
  } else {
    msg = e.what();
  }
  const auto newline = msg.find('\n');
  return newline == std::string::npos ? msg : msg.substr(0, newline);
}

// A dense, contiguous CPU tensor that owns exactly its bytes: the archive
// stores whole storages, so a view would otherwise drag its base along.
at::Tensor storable(const std::string& name, const at::Tensor& tensor) {
  if (!tensor.defined()) throw std::invalid_argument("write_tensor_file: tensor '" + name + "' is undefined");
  at::Tensor t = tensor.detach();
  if (!t.device().is_cpu()) t = t.cpu();
  const bool owns_exactly = t.is_contiguous() && t.storage_offset() == 0 &&
                            t.storage().nbytes() == static_cast<size_t>(t.numel()) * t.element_size();
  if (!owns_exactly) t = t.clone(at::MemoryFormat::Contiguous);
  return t;
}

}  // namespace

FileChecksum write_tensor_file(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                               const std::string& metadata_json, const std::string& crash_label, int64_t rank) {
  c10::Dict<std::string, at::Tensor> dict;
  c10::Dict<std::string, int64_t> checksums;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor t = storable(name, tensor);
    checksums.insert(name, static_cast<int64_t>(tensor_crc(t)));
    dict.insert(name, std::move(t));
  }

  torch::serialize::OutputArchive archive;
  archive.write(kFormatKey, c10::IValue(std::string(kFormatTag)));
  archive.write(kMetadataKey, c10::IValue(metadata_json));
  archive.write(kTensorsKey, c10::IValue(dict));
  archive.write(kChecksumsKey, c10::IValue(checksums));

  io::AtomicFile file(path);
  try {
    archive.save_to([&file](const void* data, size_t size) { return file.write(data, size); });
  } catch (const std::exception& e) {
    // A failed write callback surfaces here as a generic zip error; errno says more.
    if (file.error() != 0) io::throw_os_error("cannot write", path, file.error());
    throw std::runtime_error("cannot write tensor file '" + path + "': " + short_message(e));
  }
  file.commit([&] { crash_point((crash_label + ".before_rename").c_str(), rank); });
  return {file.bytes_written(), file.crc32c()};
}

TensorFile read_tensor_file(const std::string& path) {
  if (!compat::path_exists(path)) throw std::runtime_error("tensor file '" + path + "' does not exist");
  if (compat::is_directory(path)) throw std::runtime_error("tensor file '" + path + "' is a directory");

  torch::serialize::InputArchive archive;
  TensorFile result;
  try {
    archive.load_from(path, c10::Device(c10::kCPU));
    c10::IValue format;
    if (!archive.try_read(kFormatKey, format) || !format.isString()) {
      throw std::runtime_error("not a HyperParallel tensor file (missing '" + std::string(kFormatKey) + "' tag)");
    }
    if (format.toStringRef() == kFormatTagV1) {
      throw std::runtime_error(
          "written by an older hp-train (format v1, without checksums); it cannot be "
          "verified, so it is not loaded: start over with --checkpoint.overwrite");
    }
    if (format.toStringRef() != kFormatTag) {
      throw std::runtime_error("unknown format '" + format.toStringRef().substr(0, 60) + "' (expected " + kFormatTag +
                               ")");
    }
    c10::IValue metadata;
    archive.read(kMetadataKey, metadata);
    result.metadata_json = metadata.toStringRef();
    c10::IValue tensors;
    archive.read(kTensorsKey, tensors);
    c10::IValue checksums;
    archive.read(kChecksumsKey, checksums);
    const auto sums = checksums.toGenericDict();
    for (const auto& entry : tensors.toGenericDict()) {
      const std::string& name = entry.key().toStringRef();
      const at::Tensor& t = entry.value().toTensor();
      check_fits_storage(name, t);
      const auto sum = sums.find(name);
      if (sum == sums.end()) throw std::runtime_error("tensor '" + name + "' has no stored checksum");
      const auto expected = static_cast<uint32_t>(sum->value().toInt());
      const uint32_t actual = tensor_crc(t);
      if (actual != expected) {
        throw std::runtime_error("tensor '" + name + "' is corrupt: its bytes have CRC-32C " + io::crc32c_hex(actual) +
                                 ", the file recorded " + io::crc32c_hex(expected) +
                                 " when it was written (the file was damaged after the save)");
      }
      result.tensors.emplace(name, t);
    }
    if (sums.size() != tensors.toGenericDict().size()) {
      throw std::runtime_error("the checksum table lists " + std::to_string(sums.size()) + " tensors, the file holds " +
                               std::to_string(tensors.toGenericDict().size()));
    }
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot read tensor file '" + path + "': " + short_message(e));
  }
  return result;
}

std::string step_directory(const std::string& folder, int64_t step) {
  return compat::join_path(folder, "step-" + std::to_string(step));
}

FileChecksum checksum_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io::throw_os_error("cannot open", path, errno);
  FileChecksum sum;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      io::throw_os_error("cannot read", path, err);
    }
    if (n == 0) break;
    sum.crc32c = io::crc32c(buffer.data(), static_cast<size_t>(n), sum.crc32c);
    sum.bytes += n;
  }
  ::close(fd);
  return sum;
}

void write_checkpoint_file(const std::string& path, const std::string& text, const std::string& crash_label,
                           int64_t rank) {
  io::AtomicFile file(path);
  file.write(text);
  file.commit([&] { crash_point((crash_label + ".before_rename").c_str(), rank); });
}

std::vector<std::string> remove_temp_files(const std::string& folder) {
  std::vector<std::string> removed;
  if (!compat::is_directory(folder)) return removed;
  auto sweep = [&removed](const std::string& dir) {
    for (const auto& name : compat::list_directory(dir)) {
      const std::string path = compat::join_path(dir, name);
      if (io::is_temp_file_name(name) && !compat::is_directory(path) && ::unlink(path.c_str()) == 0) {
        removed.push_back(path);
      }
    }
  };
  sweep(folder);
  for (const auto& name : compat::list_directory(folder)) {
    const std::string path = compat::join_path(folder, name);
    if (compat::is_directory(path)) sweep(path);
  }
  return removed;
}

void write_latest_marker(const std::string& folder, int64_t step, int64_t rank) {
  if (step < 0) throw std::invalid_argument("write_latest_marker: negative step " + std::to_string(step));
  write_checkpoint_file(compat::join_path(folder, "latest"), std::to_string(step) + "\n", "latest", rank);
}

std::optional<int64_t> read_latest_marker(const std::string& folder) {
  const std::string path = compat::join_path(folder, "latest");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    // Not found is "no checkpoint yet"; anything else (permissions) is an error.
    if (errno != ENOENT)
      throw std::runtime_error("cannot access checkpoint marker '" + path + "': " + std::strerror(errno));
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open checkpoint marker '" + path + "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  const auto first = text.find_first_not_of(" \t\r\n");
  const auto last = text.find_last_not_of(" \t\r\n");
  text = first == std::string::npos ? std::string() : text.substr(first, last - first + 1);

  int64_t step = -1;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), step);
  if (text.empty() || err != std::errc() || end != text.data() + text.size() || step < 0) {
    throw std::runtime_error("checkpoint marker '" + path + "' does not hold a step number (found \"" +
                             text.substr(0, 40) + "\")");
  }
  return step;
}

void make_directories(const std::string& path) {
  std::string error;
  if (!compat::create_directories(path, &error)) throw std::runtime_error(error);
  if (!compat::is_directory(path)) throw std::runtime_error("cannot create directory '" + path + "': not a directory");
}

}  // namespace hyper_parallel::train
