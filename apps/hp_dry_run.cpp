// hp-dry-run: a job of up to thousands of ranks built in one process, without its weights
// (TorchTitan's COMM_MODE=fake_backend dry run). It takes exactly hp-train's config (TOML +
// --section.key overrides) plus the world to play:
//
//   hp-dry-run --world-size 64 [--ranks 0,63] [--json] --config FILE [--section.key VALUE ...]
//
// For each rank asked (default 0): the job built on meta tensors over a fake process group
// (src/train/dry_run.h) and one step run through it: parameter, master, gradient and AdamW
// bytes as hp-train's metrics log them, the checkpoint's size, the step's collectives by
// kind; beside them the closed-form state of the model's parameters as parallelized
// (src/train/memory_formula.h: any family), and for a Llama the activations of one
// micro-batch by formula with each activation_checkpoint.mode (none, full, and selective
// every selective_ac_option-th block); the step itself runs the job's mode.
//
//   hp-run --nproc-per-node N hp-dry-run --measure --config FILE ...
//
// runs one micro-batch of the same job for real instead and prints the activations the
// allocator saw (bench/memory_probe.h) beside the formula's: the check of the formula.
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#if HP_DRY_RUN_MEASURE
#include "bench/memory_probe.h"
#endif
#include "hyper_parallel/nn/activation_checkpoint.h"
#include "hyper_parallel/core/distributed.h"
#include "hyper_parallel_train/config/job_config.h"
#include "train/dry_run.h"
#include "train/memory_formula.h"
#include "train/metrics/state_bytes.h"
#include "train/metrics/progress.h"

namespace hp = hyper_parallel;
namespace train = hyper_parallel::train;

namespace {

struct DryRunArgs {
  int64_t world_size = 0;
  std::vector<int64_t> ranks{0};
  bool json = false;
  bool measure = false;
  std::vector<std::string> job_args;  // everything else: hp-train's
};

int64_t parse_count(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
  }
  if (used != text.size() || v < 0) throw std::invalid_argument(flag + " '" + text + "': expected an integer >= 0");
  return v;
}

DryRunArgs parse_args(int argc, char** argv) {
  DryRunArgs a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--world-size") {
      a.world_size = parse_count(flag, value());
    } else if (flag == "--ranks") {
      a.ranks.clear();
      std::stringstream list(value());
      for (std::string r; std::getline(list, r, ',');) a.ranks.push_back(parse_count(flag, r));
    } else if (flag == "--json") {
      a.json = true;
    } else if (flag == "--measure") {
      a.measure = true;
    } else {
      a.job_args.push_back(flag);
    }
  }
  return a;
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

void print_row(const char* name, int64_t dry_run, int64_t formula) {
  std::printf("  %-22s %14.3f GiB %14.3f GiB%s\n", name, gib(dry_run), gib(formula),
              dry_run == formula ? "" : "  (differ)");
}

nlohmann::json state_json(const train::StateBytes& s) {
  return {{"parameters", s.parameters},
          {"masters", s.masters},
          {"gradients", s.gradients},
          {"optimizer", s.optimizer},
          {"model_parameters", s.model_parameters}};
}

nlohmann::json activations_json(const train::ActivationBytes& a) {
  return {{"per_block", a.per_block},
          {"checkpointed_block", a.checkpointed_block},
          {"checkpointed_blocks", a.checkpointed_blocks},
          {"outside_blocks", a.outside_blocks},
          {"held_after_forward", a.held_after_forward}};
}

int run_dry(const DryRunArgs& a, const train::JobConfig& cfg) {
  if (a.world_size < 1) throw std::invalid_argument("--world-size N is required (the number of ranks to play)");
  const train::ParallelDims dims = train::ParallelDims::of(cfg.parallelism);
  nlohmann::json out = nlohmann::json::array();
  for (int64_t rank : a.ranks) {
    const auto start = std::chrono::steady_clock::now();
    const train::DryRunRank r = train::dry_run_rank(cfg, a.world_size, rank);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const train::StateBytes formula = train::state_bytes_formula(r.parameters, cfg, dims, rank);
    // Each mode's activations; the job's own [activation_checkpoint] is what the step ran.
    // A family that counts no block activations gets none, and says so.
    const std::string& every = cfg.activation_checkpoint.selective_ac_option;
    const std::vector<std::pair<std::string, hp::BlockCheckpointing>> modes = {
        {"none", hp::block_checkpointing("none", every)},
        {"full", hp::block_checkpointing("full", every)},
        {"selective", hp::block_checkpointing("selective", every)}};
    nlohmann::json activations = nullptr;
    const std::string& no_activations = r.no_block_activations;
    if (r.block_activation_bytes >= 0) {
      activations = nlohmann::json::object();
      for (const auto& [mode, policy] : modes) {
        activations[mode] = activations_json(
            train::activation_bytes_formula(r.block_activation_bytes, r.sizes, r.loss_terms, cfg, dims, policy));
      }
    }
    nlohmann::json collectives = nlohmann::json::object();
    for (const auto& c : r.collectives) collectives[c.kind] = {{"count", c.count}, {"bytes", c.bytes}};
    out.push_back({{"rank", rank},
                   {"world_size", a.world_size},
                   {"seconds", seconds},
                   {"state", state_json(r.state)},
                   {"state_formula", state_json(formula)},
                   {"checkpoint_bytes", r.checkpoint_bytes},
                   {"checkpoint_formula", train::checkpoint_bytes(formula)},
                   {"collectives_per_step", collectives},
                   {"activations", activations},
                   {"activation_checkpoint", cfg.activation_checkpoint.mode}});
    if (a.json) continue;
    if (rank == a.ranks.front()) {
      std::printf("hp-dry-run: %s; %s = %lld ranks; %s; batch %lld x %lld, %lld micro-batch(es) per step\n",
                  r.model.c_str(), dims.describe().c_str(), static_cast<long long>(a.world_size),
                  cfg.training.dtype.c_str(), static_cast<long long>(cfg.training.batch_size),
                  static_cast<long long>(cfg.training.seq_len), static_cast<long long>(cfg.training.grad_accum_steps));
    }
    std::printf("\nrank %lld (built and stepped on meta tensors in %.1f s; process peak %.0f MiB)\n",
                static_cast<long long>(rank), seconds, train::peak_memory_mib());
    std::printf("  %-22s %18s %18s\n", "", "dry run", "formula");
    print_row("parameters (model)", r.state.parameters - r.state.masters, formula.parameters - formula.masters);
    print_row("masters / FSDP shards", r.state.masters, formula.masters);
    print_row("gradients", r.state.gradients, formula.gradients);
    print_row("optimizer (AdamW)", r.state.optimizer, formula.optimizer);
    print_row("state", r.state.parameters + r.state.gradients + r.state.optimizer,
              formula.parameters + formula.gradients + formula.optimizer);
    print_row("checkpoint", r.checkpoint_bytes, train::checkpoint_bytes(formula));
    if (activations.is_null()) {
      std::printf("  activations per micro-batch: not estimated: %s\n", no_activations.c_str());
    } else {
      std::printf(
          "  activations per micro-batch (formula; + one block's %.1f MiB while a checkpointed block "
          "recomputes):\n",
          activations["none"]["per_block"].get<int64_t>() / 1048576.0);
      for (const auto& [mode, policy] : modes) {
        std::printf("    %-26s %10.3f GiB%s\n", policy.str().c_str(),
                    gib(activations[mode]["held_after_forward"].get<int64_t>()),
                    mode == cfg.activation_checkpoint.mode ? "  (this job's activation_checkpoint.mode)" : "");
      }
    }
    std::printf("  collectives per step (bytes this rank sends):\n");
    for (const auto& c : r.collectives) {
      std::printf("    %-16s %8lld  %12.3f GiB\n", c.kind.c_str(), static_cast<long long>(c.count), gib(c.bytes));
    }
  }
  if (a.json) std::cout << out.dump(1) << std::endl;
  return 0;
}

int run_measure([[maybe_unused]] const train::JobConfig& cfg) {
#if !HP_DRY_RUN_MEASURE
  throw std::invalid_argument(
      "--measure reads the allocator through the memory probe, which this build has not (the sanitizer build "
      "builds no benchmarks); run build/bin/hp-dry-run");
#else
  hp_memory_probe_install();
  hp::InitOptions init;
  init.device_type = cfg.training.device;
  hp::init_process_group(init);  // from hp-run's environment
  const train::MeasuredActivations m = train::measure_activations(
      cfg, hp_memory_probe_current_bytes, hp_memory_probe_reset_peak, hp_memory_probe_peak_bytes);
  if (hp::get_rank() == 0) {
    nlohmann::json out = {{"saved", m.saved}, {"peak", m.peak}, {"intra_op_threads", at::get_num_threads()}};
    std::cout << out.dump() << std::endl;
  }
  hp::destroy_process_group();
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const DryRunArgs a = parse_args(argc, argv);
    bool help = false;
    train::JobConfig cfg = train::parse_job_config(a.job_args, &help);
    if (help) {
      std::cout << "usage: hp-dry-run --world-size N [--ranks R,R...] [--json] "
                   "[--config FILE] [--section.key VALUE ...]\n"
                   "       hp-run --nproc-per-node N hp-dry-run --measure [--config FILE] [--section.key VALUE ...]\n\n"
                << train::job_config_usage();
      return 0;
    }
    return a.measure ? run_measure(cfg) : run_dry(a, cfg);
  } catch (const c10::Error& e) {
    std::cerr << "hp-dry-run: " << e.what_without_backtrace() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "hp-dry-run: " << e.what() << std::endl;
  }
  return 1;
}
