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
// folder whose tokenizer files (and token ids) go with the export.
#include <chrono>
#include <iostream>
#include <string>

#include "hyper_parallel/model_registry.h"
#include "train/saved_model.h"

namespace hp = hyper_parallel;

namespace {

int usage() {
  std::cerr << "usage: hp-hf-export CHECKPOINT_FOLDER OUT_DIR [--step N] [--dtype bfloat16|float32] "
               "[--max-shard-bytes N] [--source HF_DIR]\n";
  return 2;
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
        step = std::stoll(value);
      } else if (key == "--dtype") {
        if (value != "bfloat16" && value != "float32")
          throw std::invalid_argument("--dtype " + value + ": bfloat16 or float32");
        options.dtype = value == "bfloat16" ? at::kBFloat16 : at::kFloat;
      } else if (key == "--max-shard-bytes") {
        options.max_shard_bytes = std::stoll(value);
      } else if (key == "--source") {
        options.source_folder = value;
      } else {
        return usage();
      }
    }
    const auto start = std::chrono::steady_clock::now();
    const hp::train::SavedModel saved = hp::train::load_saved_model(checkpoint, step);
    const hp::HfExportResult r =
        hp::export_hf_checkpoint(*saved.model, hp::model_family(saved.config.name), out, options);
    std::cout << "hp-hf-export: step " << saved.step << " (saved at dp " << saved.identity.data_parallel_degree
              << " x tp " << saved.identity.tensor_parallel_degree << ", " << saved.identity.dtype << ") -> " << out
              << ": " << r.files.size() << " files, " << r.total_bytes << " bytes of tensors, "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s" << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "hp-hf-export: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
