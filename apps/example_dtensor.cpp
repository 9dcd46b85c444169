// hp-example: distributes a tensor over all ranks, runs DTensor ops with autograd and
// checks every result against the same computation on one process.
//
//   hp-run --nproc-per-node 2 build/bin/hp-example
//   hp-example --fail-rank R --exit-code C   (rank R exits with C mid-run: a launcher test)
//   hp-example --throw-rank R --exit-code C  (rank R throws, then tears down slowly: its
//                                             peers exit first; hp-run must still name R)
#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include "hyper_parallel/core/fatal_error.h"
#include "hyper_parallel/hyper_parallel.h"

namespace {

bool check(const char* what, const at::Tensor& got, const at::Tensor& want, int64_t rank) {
  const double err = (got - want).abs().max().item<double>();
  const bool ok = err < 1e-10;
  std::cout << "rank " << rank << ": " << what << (ok ? " OK" : " MISMATCH") << " (max abs err " << err << ")"
            << std::endl;
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t fail_rank = -1, throw_rank = -1;
  int exit_code = 3;
  bool thrown_on_purpose = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--fail-rank" && i + 1 < argc)
      fail_rank = std::atoll(argv[++i]);
    else if (a == "--throw-rank" && i + 1 < argc)
      throw_rank = std::atoll(argv[++i]);
    else if (a == "--exit-code" && i + 1 < argc)
      exit_code = std::atoi(argv[++i]);
    else {
      std::cerr << "hp-example: unknown argument '" << a << "'; expected --fail-rank R | --throw-rank R [--exit-code C]"
                << std::endl;
      return 2;
    }
  }
  try {
    if (!hp::is_initialized()) hp::init_process_group();  // from hp-run's environment
    auto mesh = hp::init_device_mesh("cpu", {hp::get_world_size()}, {"tp"});
    const int64_t rank = mesh.get_rank();
    // The same data on every rank (fixed seed), V = 11 so shards are uneven.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
    at::Tensor x = at::randn({6, 11}, gen, at::kDouble);
    at::Tensor b = at::randn({11}, gen, at::kDouble);
    at::Tensor c = at::randn({6, 11}, gen, at::kDouble);

    if (rank == fail_rank) {
      std::cerr << "rank " << rank << ": failing on purpose with exit code " << exit_code << std::endl;
      std::cout.flush();
      // Dies at once, as a crash does. std::exit ran static destructors first: the process
      // group closed its sockets while this rank still lived, a peer could die of the
      // reset and exit first, and hp-run then named that peer (status 1) as the failure.
      std::_Exit(exit_code);
    }
    if (rank == throw_rank) {
      thrown_on_purpose = true;
      throw std::runtime_error("rank " + std::to_string(rank) + ": throwing on purpose");
    }

    // Reference on one process.
    at::Tensor x1 = x.clone().set_requires_grad(true);
    at::Tensor y1 = at::tanh(x1 * 2.0 + b);
    (y1 * c).sum().backward();

    // Distributed: x sharded along the vocabulary-like dim 1, b replicated.
    at::Tensor dx = hp::distribute_tensor(x, mesh, {hp::Shard(1)}).set_requires_grad(true);
    at::Tensor db = hp::distribute_tensor(b, mesh, {hp::Replicate()});
    at::Tensor dy = at::tanh(dx * 2.0 + db);
    (hp::full_tensor(dy) * c).sum().backward();

    bool ok = true;
    ok &= check("forward  tanh(2x + b)", hp::full_tensor(dy), y1, rank);
    ok &= check("backward d/dx", hp::full_tensor(dx.grad()), x1.grad(), rank);
    at::Tensor moved = hp::redistribute(dy, {hp::Shard(0)});
    ok &= check("redistribute Shard(1) -> Shard(0)", hp::full_tensor(moved), y1, rank);
    std::cout << "rank " << rank << ": local piece " << hp::to_local(dy).sizes() << " of " << dy.sizes() << " with "
              << hp::placements_of(dy) << std::endl;
    if (!ok) return 1;
    std::cout << "rank " << rank << ": all checks passed" << std::endl;
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    const std::string message =
        "hp-example: " + std::string(c10_error ? c10_error->what_without_backtrace() : e.what());
    std::cerr << message << std::endl;
    hp::record_fatal_error(message);
    if (thrown_on_purpose) {
      // A slow teardown (as a rank that saves its state before leaving): the peers see the
      // disconnect now and exit before this rank does.
      hp::destroy_process_group();
      std::this_thread::sleep_for(std::chrono::seconds(1));
      return exit_code;
    }
    return 1;
  }
  return 0;
}
