// checkpoint_io.cpp — atomic per-rank tensor files and the `latest` marker.
//
// A tensor file is a LibTorch archive (the zip format of torch::save) holding
// three attributes: "hp_format" (a tag so that a foreign archive is rejected
// clearly), "metadata" (the JSON string) and "tensors" (a Dict[str, Tensor]).
// A dict rather than one archive key per tensor because archive keys become
// TorchScript attribute names, and parameter names such as "layers.0.weight"
// are not valid attribute names.
#include "train/checkpoint_io.h"

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
#include <system_error>

#include "compat/file_system.h"

namespace hyper_parallel::train {
namespace {


constexpr const char* kFormatKey = "hp_format";
constexpr const char* kFormatTag = "hyper_parallel.tensor_file.v1";
constexpr const char* kMetadataKey = "metadata";
constexpr const char* kTensorsKey = "tensors";

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

[[noreturn]] void throw_io(const std::string& what, const std::string& path, int err) {
  throw std::runtime_error(what + " '" + path + "': " + errno_text(err));
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

// fsync of the directory makes the rename itself durable, not only the data.
void fsync_directory(const std::string& file_path) {
  std::string dir = compat::parent_path(file_path);
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the data itself is already synced
  ::fsync(fd);
  ::close(fd);
}

// "<path>.tmp-<pid>" that becomes `path` on commit() and is removed otherwise,
// so neither a failure nor an exception leaves a half-written file behind.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path)
      : path_(std::move(path)), tmp_path_(path_ + ".tmp-" + std::to_string(::getpid())) {
    fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_io("cannot create the temporary file for '" + path_ + "':", tmp_path_, errno);
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_path_.c_str());
  }

  // Never throws: it runs as a callback inside LibTorch's zip writer (C code
  // that must not be unwound through). Returns the bytes written; on failure
  // the error is kept for commit()/error() and a short count is returned.
  size_t write(const void* data, size_t size) noexcept {
    if (error_ != 0) return 0;
    const char* p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd_, p + done, size - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        error_ = errno;
        return done;
      }
      done += static_cast<size_t>(n);
    }
    return done;
  }

  int error() const { return error_; }
  const std::string& path() const { return path_; }

  void commit() {
    if (error_ != 0) throw_io("cannot write", tmp_path_, error_);
    if (::fsync(fd_) != 0) throw_io("cannot fsync", tmp_path_, errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_io("cannot close", tmp_path_, errno);
    if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) throw_io("cannot rename " + tmp_path_ + " to", path_, errno);
    committed_ = true;
    fsync_directory(path_);
  }

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  int error_ = 0;
  bool committed_ = false;
};

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

void write_tensor_file(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::string& metadata_json) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, storable(name, tensor));

  torch::serialize::OutputArchive archive;
  archive.write(kFormatKey, c10::IValue(std::string(kFormatTag)));
  archive.write(kMetadataKey, c10::IValue(metadata_json));
  archive.write(kTensorsKey, c10::IValue(dict));

  AtomicFile file(path);
  try {
    archive.save_to([&file](const void* data, size_t size) { return file.write(data, size); });
  } catch (const std::exception& e) {
    // A failed write callback surfaces here as a generic zip error; errno says more.
    if (file.error() != 0) throw_io("cannot write", path, file.error());
    throw std::runtime_error("cannot write tensor file '" + path + "': " + short_message(e));
  }
  file.commit();
}

TensorFile read_tensor_file(const std::string& path) {
  if (!compat::path_exists(path)) throw std::runtime_error("tensor file '" + path + "' does not exist");
  if (compat::is_directory(path)) throw std::runtime_error("tensor file '" + path + "' is a directory");

  torch::serialize::InputArchive archive;
  TensorFile result;
  try {
    archive.load_from(path, c10::Device(c10::kCPU));
    c10::IValue format;
    if (!archive.try_read(kFormatKey, format) || !format.isString() || format.toStringRef() != kFormatTag) {
      throw std::runtime_error("not a HyperParallel tensor file (missing or unknown '" + std::string(kFormatKey) +
                               "' tag)");
    }
    c10::IValue metadata;
    archive.read(kMetadataKey, metadata);
    result.metadata_json = metadata.toStringRef();
    c10::IValue tensors;
    archive.read(kTensorsKey, tensors);
    for (const auto& entry : tensors.toGenericDict()) {
      result.tensors.emplace(entry.key().toStringRef(), entry.value().toTensor());
    }
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot read tensor file '" + path + "': " + short_message(e));
  }
  return result;
}

std::string step_directory(const std::string& folder, int64_t step) {
  return compat::join_path(folder, "step-" + std::to_string(step));
}

void write_latest_marker(const std::string& folder, int64_t step) {
  if (step < 0) throw std::invalid_argument("write_latest_marker: negative step " + std::to_string(step));
  AtomicFile file(compat::join_path(folder, "latest"));
  const std::string text = std::to_string(step) + "\n";
  file.write(text.data(), text.size());
  file.commit();
}

std::optional<int64_t> read_latest_marker(const std::string& folder) {
  const std::string path = compat::join_path(folder, "latest");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    // Not found is "no checkpoint yet"; anything else (permissions) is an error.
    if (errno != ENOENT) throw std::runtime_error("cannot access checkpoint marker '" + path + "': " + std::strerror(errno));
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
