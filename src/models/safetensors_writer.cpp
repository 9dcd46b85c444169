#include "models/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "io/whole_file.h"
#include "models/safetensors.h"

namespace hyper_parallel::hf {

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this writer copies bytes as they are");

// The header text (padded) and the tensors in data order.
struct Plan {
  std::string header;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

Plan plan_file(const std::map<std::string, at::Tensor>& tensors, const std::map<std::string, std::string>& metadata) {
  Plan p;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) throw std::invalid_argument("write_safetensors: tensor '" + name + "' is undefined");
    if (name == "__metadata__")
      throw std::invalid_argument("write_safetensors: '__metadata__' is the format's own key");
    safetensors_dtype_name(t.scalar_type());  // refuses a dtype the format cannot name, before anything is written
    p.tensors.emplace_back(name, t);
  }
  std::stable_sort(p.tensors.begin(), p.tensors.end(), [](const auto& a, const auto& b) {
    return a.second.element_size() > b.second.element_size();  // names stay sorted within a size
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : p.tensors) {
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  p.header = header.dump();
  p.header.append((8 - p.header.size() % 8) % 8, ' ');
  return p;
}

}  // namespace

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const Plan p = plan_file(tensors, metadata);
  io::AtomicFile file(path);
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(p.header.size()) >> (8 * i));
  file.write(length, 8);
  file.write(p.header);
  for (const auto& [name, t] : p.tensors) {
    const at::Tensor c = t.detach().cpu().contiguous();              // one tensor at a time
    if (c.nbytes() > 0) file.write(c.const_data_ptr(), c.nbytes());  // an empty one has no storage
  }
  file.commit();
}

}  // namespace hyper_parallel::hf
