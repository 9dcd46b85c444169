// hp-parity: our side of the parity test against PyTorch's DTensor and loss_parallel.
// Reads the cases pytorch_parity.py wrote (DIR/manifest.json and raw tensors), runs them
// through our DTensor, redistribute and loss_parallel, and writes what PyTorch's side
// writes, to DIR/ours/rank<R>/. Launched by tests/parity/run_parity.sh through hp-run.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>

#include <fstream>
#include <iostream>
#include <map>

#include "compat/file_system.h"
#include "hyper_parallel/hyper_parallel.h"

namespace hp = hyper_parallel;
namespace F = torch::nn::functional;
using nlohmann::json;

namespace {

std::string dir;

at::Tensor read(const std::string& path, at::ScalarType dtype, const std::vector<int64_t>& shape) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("hp-parity: cannot open " + path);
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  if (!in) throw std::runtime_error("hp-parity: " + path + " is shorter than " + std::to_string(t.nbytes()) + " bytes");
  return t;
}

void write(const std::string& path, const at::Tensor& t) {
  hp::compat::create_directories(hp::compat::parent_path(path));
  at::Tensor c = t.detach().cpu().contiguous();
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

std::vector<int64_t> shape_of(const json& c) { return c.at("shape").get<std::vector<int64_t>>(); }

at::Tensor input(const json& c, const std::string& name, at::ScalarType dtype = at::kDouble,
                 std::optional<std::vector<int64_t>> shape = std::nullopt) {
  return read(dir + "/inputs/" + c.at("name").get<std::string>() + "/" + name + ".bin", dtype,
              shape ? *shape : shape_of(c));
}

hp::Placement placement(const std::string& s) {
  if (s == "S0") return hp::Shard(0);
  if (s == "S1") return hp::Shard(1);
  if (s == "R") return hp::Replicate();
  if (s == "P") return hp::Partial();
  throw std::invalid_argument("hp-parity: unknown placement '" + s + "'");
}

at::ScalarType dtype_of(const std::string& s) { return s == "float32" ? at::kFloat : at::kDouble; }

// The same per-element coefficients pytorch_parity.py's loss_coeff draws (so 'none' is
// checked elementwise): read from the file it wrote alongside, or ones.
at::Tensor loss_coeff(const json& c, const at::Tensor& loss) {
  if (c.at("reduction") != "none") return at::ones({}, loss.options());
  return input(c, "coeff", at::kDouble, loss.sizes().vec()).to(loss.scalar_type());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: hp-run --nproc-per-node TP hp-parity DIR" << std::endl;
    return 2;
  }
  dir = argv[1];
  std::ifstream mf(dir + "/manifest.json");
  const json manifest = json::parse(mf);
  const int64_t tp = manifest.at("tp").get<int64_t>();
  hp::init_process_group();
  const int64_t rank = hp::get_rank();
  const std::string out = dir + "/ours/rank" + std::to_string(rank) + "/";
  std::map<std::vector<int64_t>, hp::DeviceMesh> meshes;
  auto mesh_of = [&](const std::vector<int64_t>& shape) {
    auto it = meshes.find(shape);
    if (it == meshes.end()) it = meshes.emplace(shape, hp::init_device_mesh("cpu", shape)).first;
    return it->second;
  };

  for (const json& c : manifest.at("cases")) {
    const std::string base = out + c.at("name").get<std::string>();
    const std::string kind = c.at("kind");
    if (kind == "cross_entropy") {
      auto mesh = mesh_of({tp});
      const at::ScalarType dtype = dtype_of(c.at("dtype"));
      auto shape = shape_of(c);
      std::vector<int64_t> tshape{shape[0]};
      tshape.insert(tshape.end(), shape.begin() + 2, shape.end());
      at::Tensor logits = input(c, "logits").to(dtype);
      at::Tensor target = input(c, "target", at::kLong, tshape);
      auto opts = F::CrossEntropyFuncOptions();
      const std::string r = c.at("reduction");
      if (r == "none") opts.reduction(torch::kNone);
      if (r == "sum") opts.reduction(torch::kSum);
      if (c.at("weighted").get<bool>()) opts.weight(input(c, "weight", at::kDouble, {{shape[1]}}).to(dtype));
      at::Tensor x = hp::distribute_tensor(logits, mesh, {hp::Shard(1)}).set_requires_grad(true);
      at::Tensor loss;
      {
        auto guard = hp::loss_parallel();
        loss = F::cross_entropy(x, target, opts);
      }
      // Our backward needs no context (PyTorch's must run inside it).
      (hp::full_tensor(loss) * loss_coeff(c, hp::full_tensor(loss))).sum().backward();
      write(base + "/loss.bin", hp::full_tensor(loss));
      write(base + "/grad.bin", hp::full_tensor(x.grad()));
    } else if (kind == "redistribute") {
      const auto mshape = c.at("mesh").get<std::vector<int64_t>>();
      auto mesh = mesh_of(mshape);
      at::Tensor full = input(c, "full");
      hp::Placements src, as_replicate;
      int64_t partial_ranks = 1;
      const auto names = c.at("src").get<std::vector<std::string>>();
      for (size_t k = 0; k < names.size(); ++k) {
        src.push_back(placement(names[k]));
        as_replicate.push_back(names[k] == "P" ? hp::Replicate() : placement(names[k]));
        if (names[k] == "P") partial_ranks *= mshape[k];
      }
      at::Tensor dt;
      if (partial_ranks > 1 || std::count(names.begin(), names.end(), "P")) {
        // Each rank's Shard piece divided among the Partial dims (as the PyTorch side).
        at::Tensor local = hp::to_local(hp::distribute_tensor(full, mesh, as_replicate)) / partial_ranks;
        hp::FromLocalOptions o;
        o.shape = full.sizes().vec();
        o.stride = full.strides().vec();
        dt = hp::DTensor::from_local(local, mesh, src, o);
      } else {
        dt = hp::distribute_tensor(full, mesh, src);
      }
      hp::Placements dst;
      for (const auto& p : c.at("dst").get<std::vector<std::string>>()) dst.push_back(placement(p));
      at::Tensor r = hp::redistribute(dt, dst);
      write(base + "/local.bin", hp::to_local(r));
      write(base + "/full.bin", hp::full_tensor(r));
    } else {
      auto mesh = mesh_of({tp});
      at::Tensor coeff = hp::distribute_tensor(input(c, "coeff"), mesh, {hp::Shard(1)});
      at::Tensor x = hp::distribute_tensor(input(c, "logits"), mesh, {hp::Shard(1)}).set_requires_grad(true);
      at::Tensor y;
      {
        auto guard = hp::loss_parallel();
        y = F::log_softmax(x, F::LogSoftmaxFuncOptions(1));
      }
      hp::full_tensor((y * coeff).sum()).backward();
      write(base + "/out.bin", hp::full_tensor(y));
      write(base + "/grad.bin", hp::full_tensor(x.grad()));
    }
  }
  hp::mesh_of(hp::distribute_tensor(at::zeros({1}), mesh_of({tp}), {hp::Replicate()})).comm(0).barrier();
  return 0;
}
