// Exporting Hugging Face checkpoints: the safetensors writer (read back by our reader and
// by Python's safetensors), config.json read back as the same LlamaArgs, an export at TP 1,
// 2 and 4 (ranks as threads) that loads back exactly and is the same bytes at every
// degree, tied and untied embeddings, sharding, errors on every rank, and transformers'
// from_pretrained on the exports of its own models: the same logits (float32: 0 expected,
// <= 1e-6 asserted; bfloat16: 0 against transformers' own bfloat16 rounding of the weights),
// and hp-hf-export on a checkpoint hp-train saved at dp 2 x tp 2.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <cstdio>
#include <set>
#include <fstream>
#include <iostream>
#include <sstream>

#include "compat/file_system.h"
#include "harness/build_paths.h"
#include "harness/hf_models.h"
#include "harness/rank_harness.h"
#include "harness/scratch_folder.h"
#include "harness/train_steps.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/models/llama.h"
#include "hyper_parallel/models/model_registry.h"
#include "models/safetensors.h"
#include "models/safetensors_writer.h"
#include "train/checkpoint/checkpoint_io.h"
#include "train/checkpoint/checkpoint_manifest.h"
#include "hyper_parallel_train/checkpoint/saved_model.h"

namespace hf_export_test {

using namespace hyper_parallel;
using hyper_parallel::testing::binary_path;
using hyper_parallel::testing::hf_models;
using hyper_parallel::testing::python_path;
using hyper_parallel::testing::read_safetensors_file;
using hyper_parallel::testing::run_command;
using hyper_parallel::testing::run_ranks;
using hyper_parallel::testing::source_dir;
using ::testing::HasSubstr;

namespace {

std::string scratch(const std::string& name) { return hyper_parallel::testing::scratch_path("hf_export/" + name); }

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// 8 query / 4 kv heads of 8 (head_dim * heads != dim), an MLP of 24 and a vocabulary of 13:
// GQA and q/k permutation at TP 1, 2 and 4, uneven vocabulary shards.
LlamaArgs export_args(bool tied = false) {
  LlamaArgs a;
  a.dim = 24;
  a.n_layers = 2;
  a.n_heads = 8;
  a.n_kv_heads = 4;
  a.head_dim = 8;
  a.vocab_size = 13;
  a.ffn_hidden_dim = 24;
  a.max_seq_len = 16;
  a.norm_eps = 1e-6;
  a.rope_theta = 500000.0;
  a.rope_scaling = Llama3RopeScaling{8.0, 1.0, 4.0, 8};
  a.tie_word_embeddings = tied;
  a.rope_tables_like_hf = true;
  return a;
}

// The seeded model, at TP `tp` when tp > 1 (called on every rank).
Llama seeded_model(const LlamaArgs& args, int64_t tp, uint64_t seed = 7) {
  Llama model(args);
  model->init_weights(seed);
  if (tp > 1) parallelize_llama(model, init_device_mesh("cpu", {tp}, {"tp"}), true, false, std::nullopt);
  return model;
}

HfExportResult export_at(const LlamaArgs& args, int64_t tp, const std::string& folder, HfExportOptions options = {}) {
  HfExportResult result;
  run_ranks(tp, [&](int64_t rank) {
    Llama model = seeded_model(args, tp);
    HfExportResult r = export_hf_checkpoint(*model, model_family("llama"), folder, options);
    if (rank == 0) result = r;
  });
  return result;
}

std::map<std::string, at::Tensor> full_parameters(Llama& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model->named_parameters()) {
    out[p.key()] = (is_dtensor(p.value()) ? full_tensor(p.value()) : p.value()).detach();
  }
  return out;
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(file_bytes(path)); }

}  // namespace

TEST(SafetensorsWriter, EveryFloatDtypeRoundTripsAlignedPaddedAndDeterministic) {
  const std::string path = scratch("round.safetensors");
  const std::map<std::string, at::Tensor> tensors = {
      {"b16", at::randn({3, 5}).to(at::kBFloat16)},
      {"f16", at::randn({7}).to(at::kHalf)},
      {"f32", at::randn({4, 3}).t()},  // not contiguous
      {"f64", at::randn({2, 2, 3}, at::kDouble)},
      {"i64", at::arange(3, at::kLong)},
      {"scalar", at::scalar_tensor(2.5)},
      {"empty", at::empty({0, 4})},
  };
  hf::write_safetensors(path, tensors, {{"format", "pt"}});
  const std::string bytes = file_bytes(path);
  hf::SafetensorsFile f(path);
  EXPECT_EQ(f.header().metadata.at("format"), "pt");
  EXPECT_EQ(f.header().data_start % 8, 0u) << "header padded to 8 bytes";
  EXPECT_EQ(bytes.substr(8, 15), "{\"__metadata__\"") << "metadata first";
  const auto back = read_safetensors_file(path);
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    EXPECT_EQ(back.at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(back.at(name), t)) << name;
    // Larger elements first: each tensor starts aligned to its element size.
    EXPECT_EQ((f.header().data_start + f.entry(name).begin) % t.element_size(), 0u) << name;
  }
  EXPECT_LT(f.entry("i64").begin, f.entry("f32").begin);
  // Padded with spaces after the JSON, whatever its length.
  size_t padded = 0;
  for (const std::string name : {"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh"}) {
    hf::write_safetensors(path + "p", {{name, at::zeros({1})}});
    const std::string b = file_bytes(path + "p");
    const std::string header = b.substr(8, hf::SafetensorsFile(path + "p").header().data_start - 8);
    EXPECT_EQ(header.size() % 8, 0u);
    EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}')) << header;
    padded += header.size() - 1 - header.rfind('}');
  }
  EXPECT_EQ(padded, 0u + 1 + 2 + 3 + 4 + 5 + 6 + 7) << "every padding length from 0 to 7 once";
  EXPECT_LT(f.entry("f32").begin, f.entry("b16").begin);
  hf::write_safetensors(path + "2", tensors, {{"format", "pt"}});
  EXPECT_EQ(file_bytes(path + "2"), bytes) << "the same tensors give the same bytes";
  for (const auto& name : compat::list_directory(compat::parent_path(path))) {
    EXPECT_EQ(name.find(".tmp-"), std::string::npos) << "temporary file left: " << name;
  }
}

TEST(SafetensorsWriter, ErrorsNameTheFileAndLeaveNothingBehind) {
  const std::string blocker = scratch("a_file");
  std::ofstream(blocker) << "x";
  try {
    hf::write_safetensors(blocker + "/w.safetensors", {{"x", at::zeros({2})}});
    ADD_FAILURE() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot write '" + blocker + "/w.safetensors'"));
    EXPECT_THAT(e.what(), HasSubstr("Not a directory"));
  }
  EXPECT_THROW(hf::write_safetensors(scratch("u.safetensors"), {{"x", at::Tensor()}}), std::invalid_argument);
  const std::string complex = scratch("c.safetensors");
  EXPECT_THROW(hf::write_safetensors(complex, {{"x", at::zeros({2})}, {"z", at::zeros({2}, at::kComplexFloat)}}),
               std::invalid_argument);
  EXPECT_FALSE(compat::path_exists(complex)) << "nothing written when one tensor cannot be";
}

TEST(SafetensorsWriter, PythonSafetensorsReadsWhatItWrites) {
  if (!hf_models().skip_reason.empty()) GTEST_SKIP() << hf_models().skip_reason;
  const std::string path = scratch("py.safetensors");
  hf::write_safetensors(path,
                        {{"a", at::arange(6, at::kFloat).view({2, 3})},
                         {"b", at::arange(5).to(at::kBFloat16)},
                         {"c", at::full({3}, 0.5, at::kHalf)},
                         {"d", at::arange(4, at::kDouble)}},
                        {{"format", "pt"}});
  const auto r = run_command(
      "'" + python_path() + "' -c \"from safetensors.torch import load_file; import torch; t = load_file('" + path +
      "'); print(sorted((k, str(v.dtype), list(v.shape), float(v.double().sum())) for k, v in t.items()))\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[('a', 'torch.float32', [2, 3], 15.0), ('b', 'torch.bfloat16', [5], 10.0), "
                                  "('c', 'torch.float16', [3], 1.5), ('d', 'torch.float64', [4], 6.0)]"));
}

TEST(HfExport, LlamaConfigReadsBackAsTheSameArgs) {
  for (bool tied : {false, true}) {
    LlamaArgs a = export_args(tied);
    const LlamaArgs b = LlamaArgs::from_hf_config_json(a.to_hf_config_json());
    EXPECT_EQ(b.dim, a.dim);
    EXPECT_EQ(b.n_layers, a.n_layers);
    EXPECT_EQ(b.n_heads, a.n_heads);
    EXPECT_EQ(b.resolved_kv_heads(), a.resolved_kv_heads());
    EXPECT_EQ(b.resolved_head_dim(), a.resolved_head_dim());
    EXPECT_EQ(b.vocab_size, a.vocab_size);
    EXPECT_EQ(b.hidden_dim(), a.hidden_dim());
    EXPECT_EQ(b.norm_eps, a.norm_eps);
    EXPECT_EQ(b.rope_theta, a.rope_theta);
    EXPECT_EQ(b.max_seq_len, a.max_seq_len);
    EXPECT_EQ(b.tie_word_embeddings, tied);
    ASSERT_TRUE(b.rope_scaling.has_value());
    EXPECT_EQ(b.rope_scaling->factor, 8.0);
    EXPECT_EQ(b.rope_scaling->original_max_position_embeddings, 8);
  }
  LlamaArgs plain;  // our own defaults: derived ffn width, no scaling
  const nlohmann::json j = nlohmann::json::parse(plain.to_hf_config_json());
  EXPECT_EQ(j.at("intermediate_size"), plain.hidden_dim());
  EXPECT_EQ(j.at("rope_parameters").at("rope_type"), "default");
  EXPECT_EQ(j.at("architectures"), nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j.at("rms_norm_eps"), 1e-5);
}

TEST(HfExport, LoadsBackExactlyAndIsTheSameBytesAtTP1To4) {
  const LlamaArgs args = export_args();
  std::map<std::string, std::string> bytes_at_tp1;
  for (int64_t tp : {1, 2, 4}) {
    const std::string folder = scratch("tp" + std::to_string(tp));
    const auto start = std::chrono::steady_clock::now();
    const HfExportResult r = export_at(args, tp, folder);
    std::cout << "[ hf export ] tp " << tp << ": " << r.total_bytes << " bytes of float32 tensors in "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s\n";
    EXPECT_EQ(r.files, (std::vector<std::string>{"model.safetensors", "config.json"}));
    for (const auto& f : r.files) {
      if (tp == 1)
        bytes_at_tp1[f] = file_bytes(compat::join_path(folder, f));
      else
        EXPECT_TRUE(file_bytes(compat::join_path(folder, f)) == bytes_at_tp1.at(f))
            << f << " at TP " << tp << " vs TP 1";
    }
    // Back into a model at TP 2: every parameter as it was.
    run_ranks(2, [&](int64_t) {
      auto module = model_family("llama").from_hf_config(folder + "/config.json");
      Llama loaded(std::dynamic_pointer_cast<LlamaImpl>(module));
      parallelize_llama(loaded, init_device_mesh("cpu", {2}, {"tp"}), true, false, std::nullopt);
      load_hf_checkpoint(*loaded, llama_hf_adapter(loaded->args()), folder);
      Llama original = seeded_model(args, 1);
      const auto want = full_parameters(original), got = full_parameters(loaded);
      for (const auto& [name, t] : want) EXPECT_TRUE(at::equal(got.at(name), t)) << name;
    });
  }
  const std::string tp1 = compat::join_path(compat::parent_path(scratch("x")), "tp1");
  const auto tensors = read_safetensors_file(tp1 + "/model.safetensors");
  EXPECT_EQ(tensors.size(), 2u + 9u * args.n_layers + 1u);
  EXPECT_TRUE(tensors.count("lm_head.weight"));
  EXPECT_EQ(read_json(tp1 + "/config.json").at("dtype"), "float32");
}

TEST(HfExport, ShardsAboveMaxShardBytesWithAnIndexAndBfloat16RoundsToNearestEven) {
  const LlamaArgs args = export_args();
  const std::string folder = scratch("sharded");
  HfExportOptions options;
  options.dtype = at::kBFloat16;
  options.max_shard_bytes = 2000;  // the embeddings (13 x 24 x 2 = 624 B) and head share one file
  const HfExportResult r = export_at(args, 2, folder, options);
  ASSERT_GT(r.files.size(), 3u);
  const nlohmann::json index = read_json(folder + "/model.safetensors.index.json");
  EXPECT_EQ(index.at("metadata").at("total_size"), r.total_bytes);
  Llama original = seeded_model(args, 1);
  const auto adapter = llama_hf_adapter(args);
  int64_t bytes = 0;
  std::set<std::string> files;
  for (const auto& m : adapter) {
    const std::string file = index.at("weight_map").at(m.hf);
    files.insert(file);
    const at::Tensor t = read_safetensors_file(compat::join_path(folder, file)).at(m.hf);
    EXPECT_EQ(t.scalar_type(), at::kBFloat16);
    at::Tensor want = original->named_parameters()[m.ours].detach();
    if (m.rope_head_dim > 0) want = rope_rows_to_hf(want, m.rope_head_dim);
    EXPECT_TRUE(at::equal(t, want.to(at::kBFloat16))) << m.hf;
    bytes += t.nbytes();
    EXPECT_LE(compat::file_size(compat::join_path(folder, file)) - 8, 2000 + 4096) << file;
  }
  EXPECT_EQ(bytes, r.total_bytes);
  EXPECT_EQ(files.size(), r.files.size() - 2) << "every shard holds a weight of the map";
  char first[64];
  std::snprintf(first, sizeof first, "model-00001-of-%05zu.safetensors", files.size());
  EXPECT_EQ(r.files.front(), first);
  // Loads as a sharded checkpoint; exporting unsharded into the folder removes the shards
  // and the index (transformers would read a stale index or model.safetensors first).
  Llama loaded(args);
  load_hf_checkpoint(*loaded, adapter, folder);
  export_at(args, 1, folder);
  EXPECT_EQ(compat::list_directory(folder), (std::vector<std::string>{"config.json", "model.safetensors"}));
}

TEST(HfExport, ATiedModelWritesItsOneEmbeddingParameterOnceAndLoadsBackTied) {
  const LlamaArgs args = export_args(/*tied=*/true);
  const std::string folder = scratch("tied");
  export_at(args, 2, folder);
  const auto tensors = read_safetensors_file(folder + "/model.safetensors");
  EXPECT_FALSE(tensors.count("lm_head.weight"));
  EXPECT_EQ(read_json(folder + "/config.json").at("tie_word_embeddings"), true);
  Llama original = seeded_model(args, 1);
  EXPECT_TRUE(at::equal(tensors.at("model.embed_tokens.weight"), original->tok_embeddings->weight.detach()));
  auto module = model_family("llama").from_hf_config(folder + "/config.json");
  load_hf_checkpoint(*module, model_family("llama").hf_adapter(*module), folder);
  Llama loaded(std::dynamic_pointer_cast<LlamaImpl>(module));
  ASSERT_TRUE(loaded->args().tie_word_embeddings);
  EXPECT_TRUE(loaded->output->weight.is_same(loaded->tok_embeddings->weight));
  EXPECT_TRUE(at::equal(loaded->output->weight, original->tok_embeddings->weight));
}

TEST(HfExport, AFolderThatCannotBeWrittenIsTheSameClearErrorOnEveryRank) {
  const std::string blocker = scratch("blocker");
  std::ofstream(blocker) << "x";
  std::vector<std::string> messages(2);
  run_ranks(2, [&](int64_t rank) {
    Llama model = seeded_model(export_args(), 2);
    try {
      export_hf_checkpoint(*model, model_family("llama"), blocker + "/out");
      ADD_FAILURE() << "expected an error";
    } catch (const std::runtime_error& e) {
      messages[rank] = e.what();
    }
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_THAT(messages[0], HasSubstr("export_hf_checkpoint to '" + blocker + "/out': cannot create the folder"));
  // The target itself a file: refused before anything is staged beside it.
  run_ranks(2, [&](int64_t rank) {
    Llama model = seeded_model(export_args(), 2);
    try {
      export_hf_checkpoint(*model, model_family("llama"), blocker);
      ADD_FAILURE() << "expected an error";
    } catch (const std::runtime_error& e) {
      messages[rank] = e.what();
    }
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_THAT(messages[0], HasSubstr("export_hf_checkpoint to '" + blocker + "': it is a file, not a folder"));
  EXPECT_EQ(file_bytes(blocker), "x");
  Llama model = seeded_model(export_args(), 1);
  HfExportOptions options;
  options.dtype = at::kLong;
  EXPECT_THROW(export_hf_checkpoint(*model, model_family("llama"), scratch("long"), options), std::invalid_argument);
  options = {};
  options.source_folder = scratch("no_such_source");
  EXPECT_THROW(export_hf_checkpoint(*model, model_family("llama"), scratch("src"), options), std::runtime_error);
}

// transformers' own models, loaded into ours at TP 1 and 2, exported, and loaded by
// transformers again (tests/hf/check_hf_export.py). Their 2 key/value heads do not split
// over TP 4 (LoadsBackExactlyAndIsTheSameBytesAtTP1To4 covers TP 4 on 4 kv heads).
TEST(HfExport, TransformersLoadsTheExportWithTheSameLogitsAtTP1And2) {
  if (!hf_models().skip_reason.empty()) GTEST_SKIP() << hf_models().skip_reason;
  nlohmann::json jobs = nlohmann::json::array();
  auto add_family = [&](const std::string& family_name, const std::string& name, int64_t tp, at::ScalarType dtype,
                        int64_t max_shard_bytes) {
    const bool llama = family_name == "llama";
    const std::string source =
        compat::join_path(hf_models(llama ? "make_llama_models.py" : "make_qwen_models.py").dir, name);
    const std::string out = scratch("hf_" + family_name + "_" + name + "_tp" + std::to_string(tp) + "_" +
                                    c10::toString(dtype) + (max_shard_bytes ? "_sharded" : ""));
    HfExportOptions options;
    options.dtype = dtype;
    options.source_folder = source;
    if (max_shard_bytes) options.max_shard_bytes = max_shard_bytes;
    const auto start = std::chrono::steady_clock::now();
    run_ranks(tp, [&](int64_t) {
      const ModelFamily& family = model_family(family_name);
      auto model = family.from_hf_config(source + "/config.json");
      if (tp > 1) family.parallelize(*model, init_device_mesh("cpu", {tp}, {"tp"}), true, false);
      load_hf_checkpoint(*model, family.hf_adapter(*model), source);
      export_hf_checkpoint(*model, family, out, options);
    });
    std::cout << "[ hf export ] " << family_name << " " << name << " tp " << tp << " " << c10::toString(dtype)
              << (max_shard_bytes ? " sharded" : "") << ": load + export "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s\n";
    jobs.push_back({{"source", source}, {"export", out}, {"dtype", dtype == at::kFloat ? "float32" : "bfloat16"}});
    return out;
  };
  auto add = [&](const std::string& name, int64_t tp, at::ScalarType dtype, int64_t max_shard_bytes) {
    return add_family("llama", name, tp, dtype, max_shard_bytes);
  };
  for (const char* name : {"gqa", "tied", "llama3", "sharded"}) {
    std::map<int64_t, std::string> folders;
    for (int64_t tp : {1, 2}) folders[tp] = add(name, tp, at::kFloat, 0);
    add(name, 2, at::kBFloat16, 0);
    for (const auto& f : compat::list_directory(folders[1])) {
      EXPECT_TRUE(file_bytes(compat::join_path(folders[2], f)) == file_bytes(compat::join_path(folders[1], f)))
          << name << ": " << f << " at TP 2 vs TP 1";
    }
  }
  add("gqa", 2, at::kFloat, 20000);
  add("llama3", 2, at::kBFloat16, 8000);
  // Qwen3 (q/k norms, permuted within a head like the q/k rows), at TP 2.
  if (hf_models("make_qwen_models.py").skip_reason.empty()) {
    for (const char* name : {"gqa", "tied"}) add_family("qwen3", name, 2, at::kFloat, 0);
  }
  const std::string jobs_file = scratch("jobs.json");
  std::ofstream(jobs_file) << jobs.dump();
  const auto r =
      run_command("'" + python_path() + "' '" + source_dir() + "/tests/hf/check_hf_export.py' '" + jobs_file + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  size_t checked = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string what = j.at("export").get<std::string>();
    EXPECT_TRUE(j.at("weights_equal").get<bool>()) << what;
    EXPECT_TRUE(j.at("loading_info").empty()) << what << ": " << j.at("loading_info").dump();
    EXPECT_EQ(j.at("tie").get<bool>(), what.find("_tied_") != std::string::npos) << what;
    // The same weights (bfloat16: as torch rounds them) in the same model: the same logits.
    EXPECT_LE(j.at("d_logits").get<double>(), 1e-6) << what;
    if (j.at("dtype") == "bfloat16") {
      // The rounding itself: 8 significant bits per weight (relative 2^-9) over two layers.
      EXPECT_LE(j.at("d_logits_fp32").get<double>(), 2e-2 * j.at("max_logit").get<double>()) << what;
    }
    std::cout << "[ hf export ] " << line << "\n";
    ++checked;
  }
  EXPECT_EQ(checked, jobs.size()) << r.output;
  // The source's tokenizer-side files travel with the export (generation_config.json here).
  EXPECT_TRUE(compat::path_exists(jobs[0].at("export").get<std::string>() + "/generation_config.json"));
}

// hp-hf-export on a checkpoint hp-train saved at dp 2 x tp 2: the unsharded weights of the
// step (the rank files of replica 0, concatenated along the recorded dims), exported, load
// back into a model built from the written config.json.
TEST(HfExport, HpHfExportWritesTheWeightsOfATrainingCheckpointSavedAtDp2Tp2) {
  train::JobConfig job = hyper_parallel::testing::tiny_checkpointed_job(scratch("run"), /*tp=*/2, /*steps=*/2);
  job.parallelism.data_parallel_degree = 2;
  hyper_parallel::testing::train_steps(job, 1, 2, /*save=*/true);
  const std::string folder = hyper_parallel::testing::checkpoint_path(job, "");
  const train::SavedModel saved = train::load_saved_model(folder);
  EXPECT_EQ(saved.step, 2);
  EXPECT_EQ(saved.config.dim, job.model.dim);
  const std::string step_dir = train::step_directory(folder, 2);
  const train::StepManifest manifest = train::read_manifest(step_dir);
  const auto rank0 = train::read_tensor_file(step_dir + "/rank-0.pt").tensors;
  const auto rank1 = train::read_tensor_file(step_dir + "/rank-1.pt").tensors;
  for (const auto& p : saved.model->named_parameters()) {
    const std::string key = "model." + p.key();
    const int64_t dim = manifest.tensors->at(key).shard_dim;
    const at::Tensor want = dim < 0 ? rank0.at(key) : at::cat({rank0.at(key), rank1.at(key)}, dim);
    EXPECT_TRUE(at::equal(p.value(), want)) << key;
  }

  const std::string out = scratch("from_training");
  const auto r = run_command(binary_path("hp-hf-export") + " '" + folder + "' '" + out + "' --dtype float32 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("step 2 (saved at dp 2 x tp 2, float32)"));
  auto module = model_family("llama").from_hf_config(out + "/config.json");
  load_hf_checkpoint(*module, model_family("llama").hf_adapter(*module), out);
  auto exported = module->named_parameters();
  for (const auto& p : saved.model->named_parameters()) EXPECT_TRUE(at::equal(exported[p.key()], p.value())) << p.key();
  const auto missing = run_command(binary_path("hp-hf-export") + " '" + scratch("no_run") + "' '" + out + "' 2>&1");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr("no checkpoint in"));
  // Probe: --max-shard-bytes 5e9 became 5 bytes, --step 1x exported step 1, --step abc
  // printed only "stoll". The whole argument is the number, or an error naming it.
  for (const auto& [args, said] : std::vector<std::pair<std::string, std::string>>{
           {"--max-shard-bytes 5e9", "--max-shard-bytes 5e9: expected a whole number >= 1"},
           {"--step 1x", "--step 1x: expected a whole number >= 0"},
           {"--step abc", "--step abc: expected a whole number >= 0"},
           {"--max-shard-bytes 0", "--max-shard-bytes 0: expected a whole number >= 1"},
           {"--step 99999999999999999999", "--step 99999999999999999999: expected a whole number"}}) {
    const std::string refused = scratch("refused");
    const auto bad = run_command(binary_path("hp-hf-export") + " '" + folder + "' '" + refused + "' " + args + " 2>&1");
    EXPECT_EQ(bad.exit_code, 1) << args << ": " << bad.output;
    EXPECT_THAT(bad.output, HasSubstr(said)) << args;
    EXPECT_FALSE(compat::path_exists(refused)) << args;
  }
}

// Probe: hp-hf-export said "saved at dp 1 x tp 2" for a dp 1 x FSDP 2 x TP 2 checkpoint.
TEST(HfExport, HpHfExportNamesTheShardDegreeOfAnFsdpCheckpoint) {
  train::JobConfig job = hyper_parallel::testing::tiny_checkpointed_job(scratch("fsdp_run"), /*tp=*/1, /*steps=*/1);
  job.parallelism.data_parallel_shard_degree = 2;
  hyper_parallel::testing::train_steps(job, 1, 1, /*save=*/true);
  const std::string folder = hyper_parallel::testing::checkpoint_path(job, "");
  const auto r = run_command(binary_path("hp-hf-export") + " '" + folder + "' '" + scratch("fsdp_export") + "' 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("step 1 (saved at dp 1 x fsdp 2 x tp 1, float32)"));
}

// Probe: `(ulimit -f 49; hp-hf-export ... --step 2)` over step 1's sharded export left
// shards 1-9 of step 2 beside 10-11, the index and config.json of step 1 and a .tmp, and
// from_pretrained loaded the mix. An export is staged beside the folder and swapped in
// whole: a failed one leaves the earlier export as it was, and nothing beside it.
TEST(HfExport, AnInterruptedExportLeavesTheEarlierOneWholeAndNothingBeside) {
  const LlamaArgs args = export_args();
  const std::string parent = scratch("interrupted"), folder = parent + "/hf";
  compat::remove_all(parent);
  HfExportOptions sharded;
  sharded.max_shard_bytes = 2000;  // 16 files
  export_at(args, 1, folder, sharded);
  std::ofstream(folder + "/README.md") << "the user's own notes";
  std::map<std::string, std::string> before;
  for (const std::string& name : compat::list_directory(folder)) before[name] = file_bytes(folder + "/" + name);
  // The next export (other weights, other shards) fails at its first file larger than its
  // first one: the file-size limit of `ulimit -f`, with SIGXFSZ ignored so that the write
  // fails instead of killing the test. Its sizes come from the same export elsewhere.
  HfExportOptions next;
  next.max_shard_bytes = 7000;
  std::vector<int64_t> sizes;
  {
    const std::string dry = scratch("interrupted_dry");
    Llama other = seeded_model(args, 1, /*seed=*/8);
    export_hf_checkpoint(*other, model_family("llama"), dry, next);
    for (const std::string& name : compat::list_directory(dry)) {
      if (name.rfind("model-", 0) == 0) sizes.push_back(compat::file_size(dry + "/" + name));
    }
  }
  ASSERT_GE(sizes.size(), 3u);
  ASSERT_GT(*std::max_element(sizes.begin() + 1, sizes.end()), sizes[0]) << "no later file to fail at";
  struct rlimit old_limit {};
  ::getrlimit(RLIMIT_FSIZE, &old_limit);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old_limit;
  limit.rlim_cur = static_cast<rlim_t>(sizes[0]);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0) << std::strerror(errno);
  std::string error;
  {
    Llama other = seeded_model(args, 1, /*seed=*/8);
    try {
      export_hf_checkpoint(*other, model_family("llama"), folder, next);
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_THAT(error, HasSubstr("File too large"));
  std::map<std::string, std::string> after;
  for (const std::string& name : compat::list_directory(folder)) after[name] = file_bytes(folder + "/" + name);
  EXPECT_TRUE(after == before) << "the earlier export changed";
  EXPECT_EQ(compat::list_directory(parent), std::vector<std::string>{"hf"}) << "something was left beside it";
  Llama loaded(args);
  load_hf_checkpoint(*loaded, llama_hf_adapter(args), folder);
  Llama original = seeded_model(args, 1);
  EXPECT_TRUE(at::equal(loaded->tok_embeddings->weight, original->tok_embeddings->weight));

  // A staging folder of an exporter that was killed (its pid gone) is removed by the next
  // export, which replaces the shards by one file and keeps the user's file.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string abandoned = parent + "/.hf.hp-staging-" + std::to_string(dead);
  ASSERT_TRUE(compat::create_directories(abandoned));
  std::ofstream(abandoned + "/model-00001-of-00002.safetensors.tmp-1-0") << "half a file";
  export_at(args, 1, folder);
  EXPECT_EQ(compat::list_directory(folder),
            (std::vector<std::string>{"README.md", "config.json", "model.safetensors"}));
  EXPECT_EQ(file_bytes(folder + "/README.md"), "the user's own notes");
  EXPECT_EQ(compat::list_directory(parent), std::vector<std::string>{"hf"});
}

// Probe: a NaN in an embedding row no batch uses trained to exit 0 and every checkpoint of
// the run was refused on resume; hp-hf-export exported the NaN. Loads name the tensor and
// the first bad element on every rank (it may sit in another rank's shard); exports refuse.
TEST(HfExport, NonFiniteWeightsAreRefusedAtLoadOnEveryRankAndNotExported) {
  const LlamaArgs args = export_args();
  const std::string folder = scratch("non_finite");
  export_at(args, 1, folder);
  {  // Both in rank 1's shards at TP 2: rows 12-23 of up_proj, vocabulary rows 7-12 of the head.
    auto tensors = read_safetensors_file(folder + "/model.safetensors");
    tensors.at("lm_head.weight")[12][5] = -std::numeric_limits<float>::infinity();
    tensors.at("model.layers.1.mlp.up_proj.weight")[20][1] = std::nanf("");
    hf::write_safetensors(folder + "/model.safetensors", tensors, {{"format", "pt"}});
  }
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int64_t rank) {
    Llama model = seeded_model(args, 2);
    try {
      load_hf_checkpoint(*model, llama_hf_adapter(args), folder);
    } catch (const std::runtime_error& e) {
      errors[rank] = e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_EQ(e, errors[0]);
    EXPECT_THAT(e, HasSubstr(folder + "/model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' holds NaN at "
                                      "[20, 1] (for layers.1.feed_forward.w3.weight)"));
  }
  Llama model = seeded_model(args, 1);
  at::NoGradGuard no_grad;
  model->output->weight[12][5] = std::numeric_limits<float>::infinity();
  try {
    export_hf_checkpoint(*model, model_family("llama"), scratch("non_finite_export"));
    ADD_FAILURE() << "exported non-finite weights";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("the weights of 'output.weight' (lm_head.weight) hold inf at [12, 5]"));
  }
  EXPECT_FALSE(compat::path_exists(scratch("non_finite_export") + "/model.safetensors"));
}

// Probe: with both model.safetensors.index.json and model.safetensors, hp-train read the
// index and transformers the single file; nothing warned.
TEST(HfExport, AFolderWithBothAnIndexAndASingleFileIsAnErrorNamingBoth) {
  const LlamaArgs args = export_args();
  const std::string folder = scratch("both");
  HfExportOptions sharded;
  sharded.max_shard_bytes = 2000;
  export_at(args, 1, folder, sharded);
  const std::string index = file_bytes(folder + "/model.safetensors.index.json");
  export_at(args, 1, folder);
  std::ofstream(folder + "/model.safetensors.index.json") << index;  // as save_pretrained leaves it
  Llama model(args);
  try {
    load_hf_checkpoint(*model, llama_hf_adapter(args), folder);
    ADD_FAILURE() << "loaded a folder holding both";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(folder + " holds both model.safetensors and model.safetensors.index.json"));
    EXPECT_THAT(e.what(), HasSubstr("remove the one that is stale"));
  }
}

// A fine-tuning run (model.hf_assets_path: GQA 8q/4kv, explicit head_dim, which the [model]
// sizes cannot say) exports with the config.json it recorded: the same model, its weights.
TEST(HfExport, HpHfExportWritesAFineTunedModelFromItsRecordedConfig) {
  if (!hf_models().skip_reason.empty()) GTEST_SKIP() << hf_models().skip_reason;
  train::JobConfig job = hyper_parallel::testing::tiny_checkpointed_job(scratch("finetune"), /*tp=*/2, /*steps=*/2);
  job.model = train::ModelConfig{};
  job.model.hf_assets_path = compat::join_path(hf_models().dir, "gqa");
  job.checkpoint.initial_load_in_hf = true;
  hyper_parallel::testing::train_steps(job, 1, 2, /*save=*/true);
  const std::string folder = hyper_parallel::testing::checkpoint_path(job, "");
  const train::SavedModel saved = train::load_saved_model(folder);
  EXPECT_EQ(as_llama(*saved.model)->args().resolved_kv_heads(), 4);
  EXPECT_EQ(as_llama(*saved.model)->args().resolved_head_dim(), 16);
  const std::string out = scratch("finetune_export");
  const auto r = run_command(binary_path("hp-hf-export") + " '" + folder + "' '" + out + "' 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto module = model_family("llama").from_hf_config(out + "/config.json");
  load_hf_checkpoint(*module, model_family("llama").hf_adapter(*module), out);
  auto exported = module->named_parameters();
  for (const auto& p : saved.model->named_parameters()) EXPECT_TRUE(at::equal(exported[p.key()], p.value())) << p.key();
}

}  // namespace hf_export_test
