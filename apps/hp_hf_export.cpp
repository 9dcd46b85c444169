// hp-hf-export: writes a Hugging Face checkpoint folder (config.json, safetensors, tokenizer
// files) from one step of hp-train's checkpoints, whatever data x tensor parallel layout
// saved it: one process rebuilds the whole model from the step's manifest (its [model]
// keys and tensor layouts) and the files of one data-parallel replica, then exports it.
//
//   hp-hf-export CHECKPOINT_FOLDER OUT_DIR [--step N] [--dtype bfloat16|float32]
//                [--max-shard-bytes N] [--source HF_DIR]
//
// CHECKPOINT_FOLDER is <job.dump_folder>/<checkpoint.folder> (it holds `latest`); --step
// picks a step (default: the one `latest` names); --dtype the written dtype (default: the
// checkpoint's, float32 masters in bfloat16 training); --max-shard-bytes the size above
// which the weights are sharded (default 50 GB, transformers'); --source a Hugging Face
// folder whose tokenizer files (and token ids) go with the export (without it, the token
// ids of the Hugging Face config.json the checkpoint recorded, as last_save_in_hf keeps).
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "hyper_parallel_train/spec/train_spec.h"
#include "hyper_parallel_train/checkpoint/saved_model.h"

namespace hp = hyper_parallel;

namespace {

// TMPDIR, or /tmp (std::filesystem is not ours to call: LibTorch wheels export their own).
std::string temp_folder() {
  const char* dir = std::getenv("TMPDIR");
  return dir && *dir ? dir : "/tmp";
}

int usage() {
  std::cerr << "usage: hp-hf-export CHECKPOINT_FOLDER OUT_DIR [--step N] [--dtype bfloat16|float32] "
               "[--max-shard-bytes N] [--source HF_DIR]\n";
  return 2;
}

// The whole of `value` as a number in [min, INT64_MAX]: "5e9", "1x" and "abc" are errors
// naming the option, not 5, 1 and a bare "stoll".
int64_t whole_number(const std::string& option, const std::string& value, int64_t min) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE || n < min) {
    throw std::invalid_argument(option + " " + value + ": expected a whole number >= " + std::to_string(min) +
                                " (digits only, no exponent or unit)");
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || std::string(argv[1]).rfind("--", 0) == 0 || std::string(argv[2]).rfind("--", 0) == 0) return usage();
  const std::string checkpoint = argv[1], out = argv[2];
  std::optional<int64_t> step;
  hp::HfExportOptions options;
  try {
    for (int i = 3; i < argc; i += 2) {
      const std::string key = argv[i];
      if (i + 1 >= argc) return usage();
      const std::string value = argv[i + 1];
      if (key == "--step") {
        step = whole_number(key, value, 0);
      } else if (key == "--dtype") {
        if (value != "bfloat16" && value != "float32")
          throw std::invalid_argument("--dtype " + value + ": bfloat16 or float32");
        options.dtype = value == "bfloat16" ? at::kBFloat16 : at::kFloat;
      } else if (key == "--max-shard-bytes") {
        options.max_shard_bytes = whole_number(key, value, 1);
      } else if (key == "--source") {
        options.source_folder = value;
      } else {
        return usage();
      }
    }
    const auto start = std::chrono::steady_clock::now();
    const hp::train::SavedModel saved = hp::train::load_saved_model(checkpoint, step);
    // Without --source, what checkpoint.last_save_in_hf writes into config.json: the token
    // ids of the Hugging Face config.json the job started from, which the checkpoint
    // records. A folder holding only that file stands in for the source.
    std::string source_note;
    std::string recorded_source;
    if (options.source_folder.empty() && saved.identity.model.contains("hf_config")) {
      std::string dir = temp_folder() + "/hp-hf-export-XXXXXX";
      if (::mkdtemp(dir.data()) == nullptr) throw std::runtime_error("cannot create a folder in " + temp_folder());
      recorded_source = dir;
      std::ofstream(dir + "/config.json") << saved.identity.model.at("hf_config").dump();
      options.source_folder = dir;
      source_note = "; token ids from the config.json the checkpoint recorded (tokenizer files: pass --source)";
    }
    struct RemoveAtExit {
      std::string dir;
      ~RemoveAtExit() {
        if (dir.empty()) return;
        ::unlink((dir + "/config.json").c_str());
        ::rmdir(dir.c_str());
      }
    } remove_recorded_source{recorded_source};
    const hp::HfExportResult r =
        hp::train::export_hf_checkpoint(*saved.model, hp::train::train_spec(saved.config.name), out, options);
    const hp::train::CheckpointIdentity& id = saved.identity;
    std::cout << "hp-hf-export: step " << saved.step << " (saved at dp " << id.data_parallel_degree;
    if (id.data_parallel_shard_degree > 1) std::cout << " x fsdp " << id.data_parallel_shard_degree;
    std::cout << " x tp " << id.tensor_parallel_degree << ", " << id.dtype << ") -> " << out << ": " << r.files.size()
              << " files, " << r.total_bytes << " bytes of tensors, "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s" << source_note
              << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "hp-hf-export: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
