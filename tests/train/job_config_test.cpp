// JobConfig (include/hyper_parallel_train/config/job_config.h): defaults, configs/debug_model.toml, command-line
// overrides, error messages (unknown keys, wrong types, malformed TOML), to_toml round
// trip, --help text and validate().
#include "harness/build_paths.h"
#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/config/parallel_dims.h"
#include "hyper_parallel_train/spec/train_spec.h"

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace job_config_test {

using namespace hyper_parallel::train;
using hyper_parallel::as_causal_lm;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

const std::string kDebugModel = hyper_parallel::testing::source_dir() + "/configs/debug_model.toml";

// Writes text to a fresh file under the test temp dir and returns its path.
std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "job_config_test_" + name;
  std::ofstream(path) << text;
  return path;
}

// The message of the std::invalid_argument fn throws (a test failure if it does not).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected std::invalid_argument";
  return "";
}

JobConfig parse(const std::vector<std::string>& args) { return parse_job_config(args); }

// Field by field, so a field missing from the descriptor table shows up by name.
void expect_same(const JobConfig& a, const JobConfig& b) {
  EXPECT_EQ(a.dump_folder, b.dump_folder);
  EXPECT_EQ(a.description, b.description);
  EXPECT_EQ(a.model.name, b.model.name);
  EXPECT_EQ(a.model.dim, b.model.dim);
  EXPECT_EQ(a.model.n_layers, b.model.n_layers);
  EXPECT_EQ(a.model.n_heads, b.model.n_heads);
  EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
  EXPECT_EQ(a.model.ffn_hidden_dim, b.model.ffn_hidden_dim);
  EXPECT_EQ(a.model.multiple_of, b.model.multiple_of);
  EXPECT_EQ(a.model.norm_eps, b.model.norm_eps);
  EXPECT_EQ(a.model.rope_theta, b.model.rope_theta);
  EXPECT_EQ(a.model.max_seq_len, b.model.max_seq_len);
  EXPECT_EQ(a.training.batch_size, b.training.batch_size);
  EXPECT_EQ(a.training.seq_len, b.training.seq_len);
  EXPECT_EQ(a.training.steps, b.training.steps);
  EXPECT_EQ(a.training.lr, b.training.lr);
  EXPECT_EQ(a.lr_scheduler.warmup_steps, b.lr_scheduler.warmup_steps);
  EXPECT_EQ(a.lr_scheduler.decay_ratio, b.lr_scheduler.decay_ratio);
  EXPECT_EQ(a.lr_scheduler.decay_type, b.lr_scheduler.decay_type);
  EXPECT_EQ(a.lr_scheduler.min_lr_factor, b.lr_scheduler.min_lr_factor);
  EXPECT_EQ(a.training.weight_decay, b.training.weight_decay);
  EXPECT_EQ(a.training.beta1, b.training.beta1);
  EXPECT_EQ(a.training.beta2, b.training.beta2);
  EXPECT_EQ(a.training.eps, b.training.eps);
  EXPECT_EQ(a.training.max_norm, b.training.max_norm);
  EXPECT_EQ(a.training.seed, b.training.seed);
  EXPECT_EQ(a.training.dtype, b.training.dtype);
  EXPECT_EQ(a.training.fused_linear_loss, b.training.fused_linear_loss);
  EXPECT_EQ(a.training.loss_terms.z_loss_weight, b.training.loss_terms.z_loss_weight);
  EXPECT_EQ(a.training.loss_terms.logit_softcap, b.training.loss_terms.logit_softcap);
  EXPECT_EQ(a.training.data, b.training.data);
  EXPECT_EQ(a.training.data_format, b.training.data_format);
  EXPECT_EQ(a.training.eos_id, b.training.eos_id);
  EXPECT_EQ(a.training.bos_id, b.training.bos_id);
  EXPECT_EQ(a.training.log_freq, b.training.log_freq);
  EXPECT_EQ(a.training.caching_allocator, b.training.caching_allocator);
  EXPECT_EQ(a.training.max_skipped_steps, b.training.max_skipped_steps);
  EXPECT_EQ(a.parallelism.tensor_parallel_degree, b.parallelism.tensor_parallel_degree);
  EXPECT_EQ(a.parallelism.disable_loss_parallel, b.parallelism.disable_loss_parallel);
  EXPECT_EQ(a.parallelism.sequence_parallel, b.parallelism.sequence_parallel);
  EXPECT_EQ(a.parallelism.loss_parallel_strict_mesh, b.parallelism.loss_parallel_strict_mesh);
  EXPECT_EQ(a.parallelism.loss_parallel_fallback_on_layout_error, b.parallelism.loss_parallel_fallback_on_layout_error);
  EXPECT_EQ(a.checkpoint.enable, b.checkpoint.enable);
  EXPECT_EQ(a.checkpoint.folder, b.checkpoint.folder);
  EXPECT_EQ(a.checkpoint.interval, b.checkpoint.interval);
  EXPECT_EQ(a.checkpoint.resume, b.checkpoint.resume);
  EXPECT_EQ(a.checkpoint.load_step, b.checkpoint.load_step);
  EXPECT_EQ(a.checkpoint.allow_data_change, b.checkpoint.allow_data_change);
  EXPECT_EQ(a.validation.enable, b.validation.enable);
  EXPECT_EQ(a.validation.freq, b.validation.freq);
  EXPECT_EQ(a.validation.steps, b.validation.steps);
  EXPECT_EQ(a.metrics.folder, b.metrics.folder);
  EXPECT_EQ(a.metrics.enable_plot, b.metrics.enable_plot);
  EXPECT_EQ(a.metrics.peak_tflops, b.metrics.peak_tflops);
}

}  // namespace

// --- defaults and the debug model --------------------------------------------------------

TEST(JobConfig, DefaultsAreTheDocumentedValues) {
  const JobConfig c;
  EXPECT_EQ(c.dump_folder, "outputs/run");
  EXPECT_EQ(c.description, "");
  EXPECT_EQ(c.config_file, "");
  EXPECT_EQ(c.model.name, "llama");
  EXPECT_EQ(c.model.dim, 256);
  EXPECT_EQ(c.model.n_layers, 2);
  EXPECT_EQ(c.model.n_heads, 8);
  EXPECT_EQ(c.model.vocab_size, 32000);
  EXPECT_EQ(c.model.ffn_hidden_dim, 0);
  EXPECT_EQ(c.model.multiple_of, 64);
  EXPECT_EQ(c.model.norm_eps, 1e-5);
  EXPECT_EQ(c.model.rope_theta, 10000.0);
  EXPECT_EQ(c.model.max_seq_len, 512);
  EXPECT_EQ(c.training.batch_size, 8);
  EXPECT_EQ(c.training.seq_len, 64);
  EXPECT_EQ(c.training.steps, 60);
  EXPECT_EQ(c.training.lr, 3e-3);
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 5);
  EXPECT_EQ(c.lr_scheduler.decay_ratio, 1.0);
  EXPECT_EQ(c.lr_scheduler.decay_type, "cosine");
  EXPECT_EQ(c.lr_scheduler.min_lr_factor, 0.1);
  EXPECT_EQ(c.metrics.peak_tflops, 0.0);
  EXPECT_EQ(c.training.weight_decay, 0.1);
  EXPECT_EQ(c.training.beta1, 0.9);
  EXPECT_EQ(c.training.beta2, 0.95);
  EXPECT_EQ(c.training.eps, 1e-8);
  EXPECT_EQ(c.training.max_norm, 1.0);
  EXPECT_EQ(c.training.seed, 42);
  EXPECT_EQ(c.training.dtype, "float32");
  EXPECT_EQ(c.training.data, "");
  EXPECT_EQ(c.training.data_format, "auto");
  EXPECT_EQ(c.training.eos_id, -1);
  EXPECT_EQ(c.training.bos_id, -1);
  EXPECT_EQ(c.training.log_freq, 1);
  EXPECT_TRUE(c.training.caching_allocator);
  EXPECT_EQ(c.training.max_skipped_steps, 0);
  EXPECT_EQ(c.training.loss_terms.z_loss_weight, 0.0);
  EXPECT_EQ(c.training.loss_terms.logit_softcap, 0.0);
  EXPECT_EQ(c.parallelism.tensor_parallel_degree, 1);
  EXPECT_FALSE(c.parallelism.disable_loss_parallel);
  EXPECT_FALSE(c.parallelism.sequence_parallel);
  EXPECT_TRUE(c.parallelism.loss_parallel_strict_mesh);
  EXPECT_FALSE(c.parallelism.loss_parallel_fallback_on_layout_error);
  EXPECT_FALSE(c.checkpoint.enable);
  EXPECT_EQ(c.checkpoint.folder, "checkpoints");
  EXPECT_EQ(c.checkpoint.interval, 10);
  EXPECT_FALSE(c.checkpoint.resume);
  EXPECT_EQ(c.checkpoint.load_step, -1);
  EXPECT_FALSE(c.checkpoint.allow_data_change);
  EXPECT_TRUE(c.validation.enable);
  EXPECT_EQ(c.validation.freq, 10);
  EXPECT_EQ(c.validation.steps, 2);
  EXPECT_EQ(c.metrics.folder, "metrics");
  EXPECT_TRUE(c.metrics.enable_plot);
  EXPECT_NO_THROW(validate(c));
}

TEST(JobConfig, NoArgumentsGiveTheDefaults) {
  bool help = true;
  const JobConfig c = parse_job_config({}, &help);
  EXPECT_FALSE(help);
  expect_same(c, JobConfig{});
  EXPECT_EQ(c.config_file, "");
}

// [model] ffn_hidden_dim = 0 is the family's derivation: the module says what it resolved
// (what the checkpoint identity records), and no rule outside the family repeats it.
TEST(JobConfig, ZeroFfnHiddenDimIsTheFamilysDerivation) {
  auto ffn_of = [](ModelConfig m) { return as_causal_lm(*train_spec(m.name).build(m)).sizes().ffn_hidden_dim; };
  ModelConfig m;
  m.dim = 128;  // Llama: 4*128*2/3 = 341 -> 384
  m.n_heads = 4;
  m.n_layers = 1;
  m.vocab_size = 64;
  EXPECT_EQ(ffn_of(m), 384);
  m.dim = 256;  // 682 -> 704
  EXPECT_EQ(ffn_of(m), 704);
  m.multiple_of = 256;  // 682 -> 768
  EXPECT_EQ(ffn_of(m), 768);
  m.ffn_hidden_dim = 100;  // explicit wins
  EXPECT_EQ(ffn_of(m), 100);
}

// Every [model] size is a DecoderSizes field the family honours: grouped-query attention, an
// explicit head size and tied embeddings from the TOML keys alone.
TEST(JobConfig, EveryModelSizeKeyReachesTheBuiltModel) {
  ModelConfig m;
  m.dim = 96;
  m.n_layers = 1;
  m.n_heads = 6;
  m.n_kv_heads = 2;
  m.head_dim = 8;
  m.vocab_size = 64;
  m.ffn_hidden_dim = 80;
  m.norm_eps = 1e-6;
  m.rope_theta = 500000.0;
  m.max_seq_len = 40;
  m.tie_word_embeddings = true;
  const auto module = train_spec(m.name).build(m);
  const hyper_parallel::DecoderSizes s = as_causal_lm(*module).sizes();
  EXPECT_EQ(s.dim, 96);
  EXPECT_EQ(s.n_heads, 6);
  EXPECT_EQ(s.n_kv_heads, 2);
  EXPECT_EQ(s.head_dim, 8);
  EXPECT_EQ(s.ffn_hidden_dim, 80);
  EXPECT_EQ(s.norm_eps, 1e-6);
  EXPECT_EQ(s.rope_theta, 500000.0);
  EXPECT_EQ(s.max_seq_len, 40);
  EXPECT_TRUE(s.tie_word_embeddings);
  // The parameters have those shapes: wk is [n_kv_heads * head_dim, dim]; tied: no separate output head.
  const auto params = module->named_parameters();
  EXPECT_EQ(params["layers.0.attention.wk.weight"].sizes(), c10::IntArrayRef({16, 96}));
  EXPECT_EQ(params["layers.0.attention.wq.weight"].sizes(), c10::IntArrayRef({48, 96}));
  EXPECT_FALSE(params.contains("output.weight"));
}

TEST(JobConfig, DebugModelFileLoadsTheTinyTwoRankJob) {
  const JobConfig c = load_job_config_file(kDebugModel);
  EXPECT_EQ(c.config_file, kDebugModel);
  EXPECT_EQ(c.dump_folder, "outputs/debug_model");
  EXPECT_FALSE(c.description.empty());
  EXPECT_EQ(c.model.name, "llama");
  EXPECT_EQ(c.model.dim, 128);
  EXPECT_EQ(c.model.n_layers, 2);
  EXPECT_EQ(c.model.n_heads, 4);
  EXPECT_EQ(c.model.vocab_size, 32000);
  EXPECT_EQ(c.model.max_seq_len, 256);
  EXPECT_EQ(c.training.batch_size, 8);
  EXPECT_EQ(c.training.seq_len, 64);
  EXPECT_EQ(c.training.steps, 60);
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 5);
  EXPECT_EQ(c.lr_scheduler.decay_type, "cosine");
  EXPECT_EQ(c.lr_scheduler.min_lr_factor, 0.1);
  EXPECT_EQ(c.training.lr, 3e-3);
  EXPECT_EQ(c.training.dtype, "float32");
  EXPECT_EQ(c.training.data, "");
  EXPECT_EQ(c.parallelism.tensor_parallel_degree, 2);
  EXPECT_FALSE(c.parallelism.disable_loss_parallel);
  EXPECT_TRUE(c.parallelism.loss_parallel_strict_mesh);
  EXPECT_FALSE(c.parallelism.loss_parallel_fallback_on_layout_error);
  EXPECT_TRUE(c.checkpoint.enable);
  EXPECT_EQ(c.checkpoint.folder, "checkpoints");
  EXPECT_EQ(c.checkpoint.interval, 20);
  EXPECT_FALSE(c.checkpoint.resume);
  EXPECT_TRUE(c.validation.enable);
  EXPECT_EQ(c.validation.freq, 20);
  EXPECT_EQ(c.validation.steps, 2);
  EXPECT_EQ(c.metrics.folder, "metrics");
  EXPECT_TRUE(c.metrics.enable_plot);
  EXPECT_NO_THROW(validate(c));
}

TEST(JobConfig, FileKeysOverlayDefaultsAndOmittedKeysKeepThem) {
  const std::string path = write_temp("partial.toml", "[training]\nsteps = 3\nlr = 1\n");
  const JobConfig c = load_job_config_file(path);
  EXPECT_EQ(c.training.steps, 3);
  EXPECT_EQ(c.training.lr, 1.0);  // a TOML integer where a float is expected
  EXPECT_EQ(c.training.batch_size, JobConfig{}.training.batch_size);
  EXPECT_EQ(c.model.dim, JobConfig{}.model.dim);
}

// --- command-line overrides ----------------------------------------------------------------

TEST(JobConfig, OverridesInBothSyntaxesApplyAfterTheFile) {
  const JobConfig c =
      parse({"--config", kDebugModel, "--parallelism.tensor_parallel_degree", "2", "--training.steps=10",
             "--training.lr", "1e-4", "--job.description=a b=c", "--model.n_heads", "8", "--training.seed", "-0",
             "--parallelism.disable_loss_parallel=true"});
  EXPECT_EQ(c.config_file, kDebugModel);
  EXPECT_EQ(c.parallelism.tensor_parallel_degree, 2);
  EXPECT_EQ(c.training.steps, 10);
  EXPECT_EQ(c.training.lr, 1e-4);
  EXPECT_EQ(c.description, "a b=c");  // only the first '=' separates key and value
  EXPECT_EQ(c.model.n_heads, 8);
  EXPECT_EQ(c.training.seed, 0);
  EXPECT_TRUE(c.parallelism.disable_loss_parallel);
  EXPECT_EQ(c.model.dim, 128);  // untouched keys come from the file
}

TEST(JobConfig, ConfigEqualsSyntaxAndJobConfigFileAliasLoadTheFile) {
  EXPECT_EQ(parse({"--config=" + kDebugModel}).model.dim, 128);
  EXPECT_EQ(parse({"--job.config_file", kDebugModel}).model.dim, 128);
}

TEST(JobConfig, FileIsLoadedFirstWhereverConfigAppearsAndOverridesApplyInOrder) {
  const JobConfig c = parse({"--training.steps", "5", "--training.steps=7", "--config", kDebugModel});
  EXPECT_EQ(c.training.steps, 7);
  EXPECT_EQ(c.model.dim, 128);
}

TEST(JobConfig, BareBoolFlagMeansTrue) {
  JobConfig c = parse({"--checkpoint.resume", "--training.steps", "3"});
  EXPECT_TRUE(c.checkpoint.resume);
  EXPECT_EQ(c.training.steps, 3);

  c = parse({"--config", kDebugModel, "--checkpoint.resume"});  // last argument
  EXPECT_TRUE(c.checkpoint.resume);
}

TEST(JobConfig, BoolOverridesAcceptTrueFalseOneZero) {
  const JobConfig c = parse({"--validation.enable", "false", "--metrics.enable_plot=0", "--checkpoint.enable", "1",
                             "--checkpoint.resume=true"});
  EXPECT_FALSE(c.validation.enable);
  EXPECT_FALSE(c.metrics.enable_plot);
  EXPECT_TRUE(c.checkpoint.enable);
  EXPECT_TRUE(c.checkpoint.resume);
}

TEST(JobConfig, HyphensInOverrideKeysReadAsUnderscores) {
  const JobConfig c = parse({"--training.batch-size", "4", "--parallelism.tensor-parallel-degree=2"});
  EXPECT_EQ(c.training.batch_size, 4);
  EXPECT_EQ(c.parallelism.tensor_parallel_degree, 2);
}

TEST(JobConfig, ApplyOverrideSetsOneKey) {
  JobConfig c;
  apply_override(c, "training.dtype", "bfloat16");
  apply_override(c, "--model.norm_eps", "1e-6");
  apply_override(c, "training.data", "");
  EXPECT_EQ(c.training.dtype, "bfloat16");
  EXPECT_EQ(c.model.norm_eps, 1e-6);
  EXPECT_EQ(c.training.data, "");
}

TEST(JobConfig, ArgvOverloadSkipsTheProgramName) {
  const char* argv[] = {"hp-train", "--training.steps", "9"};
  EXPECT_EQ(parse_job_config(3, argv).training.steps, 9);
}

TEST(JobConfig, HelpReturnsDefaultsWithoutReadingAnything) {
  bool help = false;
  const JobConfig c = parse_job_config({"--config", "/no/such/file.toml", "--bogus", "--help"}, &help);
  EXPECT_TRUE(help);
  expect_same(c, JobConfig{});
  help = false;
  parse_job_config({"-h"}, &help);
  EXPECT_TRUE(help);
}

TEST(JobConfig, ParsedConfigIsValidated) {
  const std::string msg = error_of([] { parse({"--training.seq_len", "1024"}); });
  EXPECT_THAT(msg, HasSubstr("training.seq_len = 1024 must be <= model.max_seq_len = 512"));
}

// --- errors: unknown keys ------------------------------------------------------------------

TEST(JobConfig, UnknownKeyInFileNamesFileKeyAndKnownKeys) {
  const std::string path = write_temp("unknown_key.toml", "[training]\nsteps = 3\nlrr = 0.1\n");
  const std::string msg = error_of([&] { load_job_config_file(path); });
  EXPECT_THAT(msg, HasSubstr(path + ": unknown key 'training.lrr' (known keys in [training]: "
                                    "batch_size, seq_len, steps, lr, weight_decay,"));
  EXPECT_THAT(msg, HasSubstr("did you mean 'training.lr'?"));
}

// TorchTitan's [lr_scheduler] holds the schedule; the keys it replaced are refused, naming
// their new spelling, in a file and on the command line.
TEST(JobConfig, ScheduleKeysOfTrainingNameTheirLrSchedulerSpelling) {
  const std::string path = write_temp("old_schedule.toml", "[training]\nwarmup_steps = 3\n");
  EXPECT_THAT(error_of([&] { load_job_config_file(path); }),
              HasSubstr(path + ": 'training.warmup_steps' is now 'lr_scheduler.warmup_steps' (TorchTitan's "
                               "[lr_scheduler] section)"));
  EXPECT_THAT(error_of([] {
                parse({"--training.min_lr_ratio", "0.1"});
              }),
              HasSubstr("--training.min_lr_ratio: 'training.min_lr_ratio' is now 'lr_scheduler.min_lr_factor'"));
  const JobConfig c =
      parse({"--lr_scheduler.warmup_steps", "3", "--lr_scheduler.decay_ratio", "0.25", "--lr_scheduler.decay_type",
             "sqrt", "--lr_scheduler.min_lr_factor", "0", "--metrics.peak_tflops", "312"});
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 3);
  EXPECT_EQ(c.lr_scheduler.decay_ratio, 0.25);
  EXPECT_EQ(c.lr_scheduler.decay_type, "sqrt");
  EXPECT_EQ(c.lr_scheduler.min_lr_factor, 0.0);
  EXPECT_EQ(c.metrics.peak_tflops, 312.0);
}

TEST(JobConfig, KeyInTheWrongSectionSuggestsItsSection) {
  const std::string path = write_temp("wrong_section.toml", "[training]\ntensor_parallel_degree = 2\n");
  EXPECT_THAT(error_of([&] { load_job_config_file(path); }),
              HasSubstr("unknown key 'training.tensor_parallel_degree'"));
  EXPECT_THAT(error_of([&] { load_job_config_file(path); }),
              HasSubstr("did you mean 'parallelism.tensor_parallel_degree'?"));
}

TEST(JobConfig, UnknownSectionAndTopLevelKeyInFileAreErrors) {
  const std::string bad_section = write_temp("bad_section.toml", "[optimizer]\nlr = 1.0\n");
  std::string msg = error_of([&] { load_job_config_file(bad_section); });
  EXPECT_THAT(msg,
              HasSubstr(bad_section + ": unknown section [optimizer] (known sections: job, "
                                      "model, training, lr_scheduler, parallelism, activation_checkpoint, checkpoint, "
                                      "validation, metrics)"));

  const std::string top_level = write_temp("top_level.toml", "dump_folder = \"x\"\n");
  msg = error_of([&] { load_job_config_file(top_level); });
  EXPECT_THAT(msg, HasSubstr(top_level + ": unknown key 'dump_folder' outside any section"));
  EXPECT_THAT(msg, HasSubstr("did you mean 'job.dump_folder'?"));

  const std::string not_table = write_temp("not_table.toml", "training = 5\n");
  EXPECT_THAT(error_of([&] { load_job_config_file(not_table); }),
              HasSubstr(not_table + ": training: expected a table [training], got integer 5"));
}

TEST(JobConfig, SwappedLettersAreOneTypoForDidYouMean) {
  EXPECT_THAT(error_of([] { parse({"--training.stpes", "3"}); }), HasSubstr("did you mean 'training.steps'?"));
  EXPECT_THAT(error_of([] { parse({"--model.dmi", "3"}); }), HasSubstr("did you mean 'model.dim'?"));
  EXPECT_THAT(error_of([] {
                parse({"--checkpoint.intreval", "3"});
              }),
              HasSubstr("did you mean 'checkpoint.interval'?"));
}

TEST(JobConfig, ResumeAndOverwriteTogetherAreRefused) {
  EXPECT_THAT(error_of([] {
                parse({"--checkpoint.resume", "--checkpoint.overwrite"});
              }),
              HasSubstr("checkpoint.resume and checkpoint.overwrite contradict each other"));
}

TEST(JobConfig, UnknownOverrideKeyNamesTheFlag) {
  std::string msg = error_of([] { parse({"--training.lrr", "0.1"}); });
  EXPECT_THAT(msg, HasSubstr("--training.lrr: unknown key 'training.lrr' (known keys in "
                             "[training]: batch_size,"));
  EXPECT_THAT(msg, HasSubstr("did you mean 'training.lr'?"));

  msg = error_of([] { parse({"--optim.lr=0.1"}); });
  EXPECT_THAT(msg, HasSubstr("--optim.lr: unknown section 'optim'"));

  msg = error_of([] { parse({"--steps", "3"}); });
  EXPECT_THAT(msg, HasSubstr("--steps: unknown option"));
  EXPECT_THAT(msg, HasSubstr("'training.steps' or 'validation.steps'"));

  JobConfig c;
  EXPECT_THAT(error_of([&] { apply_override(c, "checkpoint.enabled", "true"); }),
              HasSubstr("--checkpoint.enabled: unknown key 'checkpoint.enabled'"));
}

TEST(JobConfig, UnknownOverrideKeyFailsBeforeTheFileIsRead) {
  const std::string msg = error_of([] { parse({"--config", "/no/such.toml", "--training.x", "1"}); });
  EXPECT_THAT(msg, HasSubstr("--training.x: unknown key"));
}

// --- errors: types and values ----------------------------------------------------------------

TEST(JobConfig, WrongTypeInFileNamesFileKeyAndValue) {
  struct Case {
    std::string toml, expected;
  };
  const std::vector<Case> cases = {
      {"[training]\nsteps = \"abc\"\n", "training.steps: expected an integer, got string \"abc\""},
      {"[training]\nsteps = 1.5\n", "training.steps: expected an integer, got float 1.5"},
      {"[training]\nlr = \"fast\"\n", "training.lr: expected a number, got string \"fast\""},
      {"[checkpoint]\nenable = 1\n", "checkpoint.enable: expected a boolean, got integer 1"},
      {"[job]\ndump_folder = 3\n", "job.dump_folder: expected a string, got integer 3"},
      {"[model]\ndim = [1, 2]\n", "model.dim: expected an integer, got array [ 1, 2 ]"},
      {"[model]\ndim = { a = 1 }\n", "model.dim: expected an integer, got a table"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = write_temp("wrong_type_" + std::to_string(i) + ".toml", cases[i].toml);
    EXPECT_THAT(error_of([&] { load_job_config_file(path); }), HasSubstr(path + ": " + cases[i].expected));
  }
}

TEST(JobConfig, WrongTypeInOverrideIsAStrictWholeStringParse) {
  struct Case {
    std::string key, value, expected;
  };
  const std::vector<Case> cases = {
      {"training.steps", "abc", "--training.steps: expected an integer, got \"abc\""},
      {"training.steps", "10x", "--training.steps: expected an integer, got \"10x\""},
      {"training.steps", " 10", "--training.steps: expected an integer, got \" 10\""},
      {"training.steps", "1.0", "--training.steps: expected an integer, got \"1.0\""},
      {"training.steps", "", "--training.steps: expected an integer, got \"\""},
      {"training.steps", "99999999999999999999", "expected an integer"},
      {"training.lr", "0.1x", "--training.lr: expected a number, got \"0.1x\""},
      {"checkpoint.resume", "yes", "--checkpoint.resume: expected a boolean, got \"yes\""},
  };
  for (const Case& c : cases) {
    JobConfig cfg;
    EXPECT_THAT(error_of([&] { apply_override(cfg, c.key, c.value); }), HasSubstr(c.expected))
        << c.key << " " << c.value;
  }
  JobConfig cfg;
  apply_override(cfg, "training.steps", "+12");
  EXPECT_EQ(cfg.training.steps, 12);
  apply_override(cfg, "training.lr", "2");  // an integer is a valid float
  EXPECT_EQ(cfg.training.lr, 2.0);
  apply_override(cfg, "job.description", "123");  // strings are taken as they are
  EXPECT_EQ(cfg.description, "123");
}

TEST(JobConfig, MalformedCommandLinesAreErrors) {
  EXPECT_THAT(error_of([] { parse({"--training.steps"}); }),
              HasSubstr("--training.steps: missing value (expected an integer)"));
  EXPECT_THAT(error_of([] {
                parse({"--training.steps", "--checkpoint.resume"});
              }),
              HasSubstr("--training.steps: missing value"));
  EXPECT_THAT(error_of([] { parse({"--config"}); }), HasSubstr("--config: missing value"));
  EXPECT_THAT(error_of([] { parse({"stray"}); }), HasSubstr("unexpected argument 'stray'"));
  EXPECT_THAT(error_of([] { parse({"--config", kDebugModel, "--config", kDebugModel}); }), HasSubstr("already given"));
}

TEST(JobConfig, MalformedTomlNamesFileLineAndColumn) {
  const std::string path = write_temp("malformed.toml", "[training]\nsteps = 3\nlr = = 0.1\n");
  const std::string msg = error_of([&] { load_job_config_file(path); });
  EXPECT_THAT(msg, HasSubstr(path + ": invalid TOML at line 3, column"));

  const std::string dup = write_temp("duplicate.toml", "[training]\nsteps = 3\nsteps = 4\n");
  EXPECT_THAT(error_of([&] { load_job_config_file(dup); }), HasSubstr(dup + ": invalid TOML at line 3"));
}

TEST(JobConfig, MissingFileIsNamed) {
  EXPECT_THAT(error_of([] { load_job_config_file("/no/such/job.toml"); }),
              HasSubstr("/no/such/job.toml: job config file not found"));
  EXPECT_THAT(error_of([] { parse({"--config", "/no/such/job.toml"}); }), HasSubstr("/no/such/job.toml"));
  EXPECT_THAT(error_of([] { load_job_config_file(::testing::TempDir()); }), HasSubstr("is a directory"));
}

// --- to_toml and usage -----------------------------------------------------------------------

TEST(JobConfig, ToTomlRoundTripsEveryField) {
  // Every field differs from its default, so a field to_toml forgets cannot go unnoticed.
  JobConfig c;
  c.dump_folder = "out/\"quoted\" \\ dir";
  c.description = "line one\nline two\ttab \x01 ünïcode";
  c.model.name = "llama3";
  c.model.dim = 96;
  c.model.n_layers = 3;
  c.model.n_heads = 6;
  c.model.n_kv_heads = 3;
  c.model.head_dim = 24;
  c.model.vocab_size = 1001;
  c.model.ffn_hidden_dim = 200;
  c.model.multiple_of = 32;
  c.model.norm_eps = 1e-6;
  c.model.rope_theta = 500000.0;
  c.model.max_seq_len = 128;
  c.model.tie_word_embeddings = true;
  c.training.batch_size = 3;
  c.training.seq_len = 17;
  c.training.steps = 11;
  c.training.lr = 0.1 + 0.2;  // not exactly 0.3: needs all 17 digits
  c.lr_scheduler = {0, 0.8, "linear", 0.0};
  c.training.weight_decay = 1e-300;
  c.training.beta1 = 0.8;
  c.training.beta2 = 0.999;
  c.training.eps = 1e-12;
  c.training.max_norm = 2.0;
  c.training.seed = 1234567890123;
  c.training.dtype = "bfloat16";
  c.training.data = "data/corpus.txt";
  c.training.data_format = "megatron";
  c.training.eos_id = 2;
  c.training.bos_id = 1;
  c.training.log_freq = 7;
  c.training.fused_linear_loss = true;
  c.training.caching_allocator = false;
  c.training.max_skipped_steps = 5;
  c.training.loss_terms.z_loss_weight = 1e-4;
  c.training.loss_terms.logit_softcap = 30.0;
  c.parallelism.tensor_parallel_degree = 3;
  c.parallelism.disable_loss_parallel = true;
  c.parallelism.sequence_parallel = true;
  c.parallelism.loss_parallel_strict_mesh = false;
  c.parallelism.loss_parallel_fallback_on_layout_error = true;
  c.checkpoint = {true, "ckpt", 4, true, false, 8, true};
  c.validation = {false, 5, 6};
  c.metrics = {"m", false, 989.0};

  const std::string text = to_toml(c);
  const std::string path = write_temp("round_trip.toml", text);
  const JobConfig back = load_job_config_file(path);
  expect_same(back, c);
  EXPECT_EQ(to_toml(back), text);
  EXPECT_THAT(text, Not(HasSubstr("config_file")));

  const JobConfig debug = load_job_config_file(kDebugModel);
  expect_same(load_job_config_file(write_temp("debug_round_trip.toml", to_toml(debug))), debug);
}

TEST(JobConfig, ToTomlWritesEverySectionInOrder) {
  const std::string text = to_toml(JobConfig{});
  size_t last = 0;
  for (const char* section : {"[job]", "[model]", "[training]", "[lr_scheduler]", "[parallelism]", "[checkpoint]",
                              "[validation]", "[metrics]"}) {
    const size_t at = text.find(std::string("\n") + section + "\n");
    ASSERT_NE(at, std::string::npos) << section;
    EXPECT_GT(at + 1, last) << section;
    last = at;
  }
  EXPECT_THAT(text, HasSubstr("\nlr = 0.003\n"));
  EXPECT_THAT(text, HasSubstr("\nrope_theta = 10000.0\n"));  // stays a TOML float
  EXPECT_THAT(text, HasSubstr("\ntensor_parallel_degree = 1\n"));
}

TEST(JobConfig, UsageListsEveryKeyWithTypeAndDefault) {
  const std::string usage = job_config_usage();
  EXPECT_THAT(usage, HasSubstr("--config FILE"));
  EXPECT_THAT(usage, HasSubstr("--help"));
  // Every key to_toml writes appears in the usage as --section.key.
  std::istringstream lines(to_toml(JobConfig{}));
  std::string line, section;
  int keys = 0;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const std::string flag = "--" + section + "." + line.substr(0, line.find(' ')) + " ";
    EXPECT_THAT(usage, HasSubstr(flag));
    ++keys;
  }
  EXPECT_EQ(keys, 73);
  EXPECT_THAT(usage, HasSubstr("--training.max_skipped_steps INT"));
  EXPECT_THAT(usage, HasSubstr("--checkpoint.load_step INT"));
  EXPECT_THAT(usage, HasSubstr("--checkpoint.allow_data_change BOOL"));
  EXPECT_THAT(usage, HasSubstr("--model.hf_assets_path STRING"));
  EXPECT_THAT(usage, HasSubstr("--checkpoint.initial_load_path STRING"));
  EXPECT_THAT(usage, HasSubstr("--checkpoint.initial_load_in_hf BOOL"));
  EXPECT_THAT(usage, HasSubstr("--checkpoint.last_save_in_hf BOOL"));
  EXPECT_THAT(usage, HasSubstr("--checkpoint.export_dtype STRING"));
  EXPECT_THAT(usage, HasSubstr("--training.lr FLOAT"));
  EXPECT_THAT(usage, HasSubstr("default 0.003"));
  EXPECT_THAT(usage, HasSubstr("--checkpoint.resume BOOL"));
  EXPECT_THAT(usage, HasSubstr("--training.steps INT"));
  EXPECT_THAT(usage, HasSubstr("--training.dtype STRING"));
  EXPECT_THAT(usage, HasSubstr("default \"float32\""));
  EXPECT_THAT(usage, HasSubstr("[parallelism]"));
  EXPECT_THAT(usage, HasSubstr("--training.data_format STRING"));
  EXPECT_THAT(usage, HasSubstr("auto | text | bin_u16 | bin_u32 | megatron"));
  EXPECT_THAT(usage, HasSubstr("--training.eos_id INT"));
}

// --- validate --------------------------------------------------------------------------------

TEST(JobConfig, ValidateErrorsNameTheKey) {
  struct Case {
    std::function<void(JobConfig&)> mutate;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](JobConfig& c) { c.model.dim = 0; }, "model.dim = 0 must be > 0"},
      {[](JobConfig& c) { c.model.n_layers = -1; }, "model.n_layers = -1 must be > 0"},
      {[](JobConfig& c) { c.model.vocab_size = 0; }, "model.vocab_size = 0 must be > 0"},
      {[](JobConfig& c) { c.model.dim = 100; }, "model.dim = 100 must be divisible by model.n_heads = 8"},
      {[](JobConfig& c) { c.model.dim = 24; }, "(the head size) must be even for RoPE"},
      {[](JobConfig& c) { c.model.ffn_hidden_dim = -1; }, "model.ffn_hidden_dim = -1 must be >= 0"},
      {[](JobConfig& c) { c.model.norm_eps = 0; }, "model.norm_eps = 0.0 must be > 0"},
      {[](JobConfig& c) { c.model.name = ""; }, "model.name must not be empty"},
      {[](JobConfig& c) { c.training.batch_size = 0; }, "training.batch_size = 0 must be > 0"},
      {[](JobConfig& c) { c.training.steps = 0; }, "training.steps = 0 must be > 0"},
      {[](JobConfig& c) { c.lr_scheduler.warmup_steps = -2; }, "lr_scheduler.warmup_steps = -2 must be >= 0"},
      {[](JobConfig& c) { c.lr_scheduler.decay_ratio = 1.5; },
       "lr_scheduler.decay_ratio = 1.5 must be in [0, 1] (1: decay right after warm-up)"},
      {[](JobConfig& c) { c.lr_scheduler.decay_ratio = -0.1; }, "lr_scheduler.decay_ratio = -0.1 must be in [0, 1]"},
      {[](JobConfig& c) { c.lr_scheduler.decay_type = "exponential"; },
       "lr_scheduler.decay_type = \"exponential\" is not one of linear, sqrt, cosine"},
      {[](JobConfig& c) { c.lr_scheduler.min_lr_factor = -0.5; },
       "lr_scheduler.min_lr_factor = -0.5 must be in [0, 1]"},
      {[](JobConfig& c) { c.metrics.peak_tflops = -1; }, "metrics.peak_tflops = -1.0 must be >= 0"},
      {[](JobConfig& c) { c.training.seq_len = 513; }, "training.seq_len = 513 must be <= model.max_seq_len = 512"},
      {[](JobConfig& c) { c.training.lr = -1; }, "training.lr = -1.0 must be > 0"},
      {[](JobConfig& c) { c.training.lr = std::numeric_limits<double>::infinity(); },
       "training.lr = inf must be finite"},
      {[](JobConfig& c) { c.lr_scheduler.min_lr_factor = 1.5; }, "lr_scheduler.min_lr_factor = 1.5 must be in [0, 1]"},
      {[](JobConfig& c) { c.training.beta2 = 1.0; }, "training.beta2 = 1.0 must be in [0, 1)"},
      {[](JobConfig& c) { c.training.eps = 0; }, "training.eps = 0.0 must be > 0"},
      {[](JobConfig& c) { c.training.max_norm = 0; }, "training.max_norm = 0.0 must be > 0"},
      {[](JobConfig& c) { c.training.seed = -1; }, "training.seed = -1 must be >= 0"},
      {[](JobConfig& c) { c.training.loss_terms.z_loss_weight = -1e-4; },
       "training.z_loss_weight = -1e-04 must be >= 0 (0: off)"},
      {[](JobConfig& c) { c.training.loss_terms.logit_softcap = -30; },
       "training.logit_softcap = -30.0 must be >= 0 (0: off)"},
      {[](JobConfig& c) { c.training.loss_terms.logit_softcap = std::numeric_limits<double>::quiet_NaN(); },
       "training.logit_softcap = nan must be finite"},
      {[](JobConfig& c) { c.training.dtype = "float16"; },
       "training.dtype = \"float16\" is not one of float32, bfloat16, float64"},
      {[](JobConfig& c) { c.training.log_freq = 0; }, "training.log_freq = 0 must be > 0"},
      {[](JobConfig& c) {
         c.training.data = "c.bin";
         c.training.data_format = "bin_u8";
       },
       "training.data_format = \"bin_u8\" is not one of auto, text, bin_u16, bin_u32, megatron"},
      {[](JobConfig& c) { c.training.data_format = "megatron"; },
       "training.data_format = \"megatron\" needs training.data"},
      {[](JobConfig& c) {
         c.training.data = "c.bin";
         c.training.eos_id = 32000;
       },
       "training.eos_id = 32000 must be -1 (none / the sidecar's) or an id below model.vocab_size = 32000"},
      {[](JobConfig& c) {
         c.training.data = "c.bin";
         c.training.bos_id = -2;
       },
       "training.bos_id = -2 must be -1"},
      {[](JobConfig& c) { c.training.eos_id = 0; }, "training.eos_id = 0 applies to pre-tokenized data"},
      {[](JobConfig& c) {
         c.training.data = "notes.txt";
         c.training.data_format = "text";
         c.training.bos_id = 1;
       },
       "training.bos_id = 1 applies to pre-tokenized data (training.data_format bin_u16, bin_u32, megatron or auto "
       "on such a file), not to a text corpus"},
      {[](JobConfig& c) { c.model.n_kv_heads = -1; }, "model.n_kv_heads = -1 must be >= 0 (0: n_heads)"},
      {[](JobConfig& c) { c.model.n_kv_heads = 3; }, "model.n_kv_heads = 3 must divide model.n_heads = 8"},
      {[](JobConfig& c) { c.model.head_dim = -2; }, "model.head_dim = -2 must be >= 0 (0: dim / n_heads)"},
      {[](JobConfig& c) { c.model.head_dim = 33; }, "model.head_dim = 33 (the head size) must be even for RoPE"},
      {[](JobConfig& c) {
         c.model.n_kv_heads = 2;
         c.parallelism.tensor_parallel_degree = 4;
       },
       "model.n_kv_heads = 2 must be divisible by parallelism.tensor_parallel_degree = 4"},
      {[](JobConfig& c) { c.parallelism.tensor_parallel_degree = 0; },
       "parallelism.tensor_parallel_degree = 0 must be >= 1"},
      {[](JobConfig& c) { c.parallelism.tensor_parallel_degree = 3; },
       "model.n_heads = 8 must be divisible by parallelism.tensor_parallel_degree = 3"},
      {[](JobConfig& c) {
         c.training.fused_linear_loss = true;
         c.parallelism.tensor_parallel_degree = 2;
         c.parallelism.disable_loss_parallel = true;
       },
       "training.fused_linear_loss = true needs loss parallel at parallelism.tensor_parallel_degree = 2"},
      {[](JobConfig& c) { c.parallelism.data_parallel_degree = 0; },
       "parallelism.data_parallel_degree = 0 must be >= 1"},
      {[](JobConfig& c) { c.parallelism.dp_bucket_mb = 0; }, "parallelism.dp_bucket_mb = 0 must be > 0"},
      {[](JobConfig& c) { c.training.grad_accum_steps = 0; }, "training.grad_accum_steps = 0 must be > 0"},
      {[](JobConfig& c) {
         c.training.batch_size = 8;
         c.parallelism.data_parallel_degree = 2;
         c.training.grad_accum_steps = 3;
       },
       "training.batch_size = 8 must be divisible by parallelism.data_parallel_degree x "
       "training.grad_accum_steps = 2 x 3"},
      {[](JobConfig& c) { c.parallelism.sequence_parallel = true; },
       "parallelism.sequence_parallel = true needs parallelism.tensor_parallel_degree > 1"},
      {[](JobConfig& c) { c.checkpoint.interval = 0; }, "checkpoint.interval = 0 must be > 0"},
      {[](JobConfig& c) {
         c.checkpoint.resume = true;
         c.checkpoint.load_step = -2;
       },
       "checkpoint.load_step = -2 must be >= 0 (or -1: latest)"},
      {[](JobConfig& c) { c.checkpoint.load_step = 4; }, "checkpoint.load_step = 4 needs checkpoint.resume = true"},
      {[](JobConfig& c) { c.training.max_skipped_steps = -1; }, "training.max_skipped_steps = -1 must be >= 0"},
      {[](JobConfig& c) { c.checkpoint.folder = ""; }, "checkpoint.folder must not be empty"},
      {[](JobConfig& c) { c.validation.freq = 0; }, "validation.freq = 0 must be > 0"},
      {[](JobConfig& c) { c.validation.steps = 0; }, "validation.steps = 0 must be > 0"},
      {[](JobConfig& c) { c.metrics.folder = ""; }, "metrics.folder must not be empty"},
      {[](JobConfig& c) { c.dump_folder = ""; }, "job.dump_folder must not be empty"},
  };
  for (const Case& c : cases) {
    JobConfig cfg;
    c.mutate(cfg);
    EXPECT_THAT(error_of([&] { validate(cfg); }), HasSubstr("invalid job config: "));
    EXPECT_THAT(error_of([&] { validate(cfg); }), HasSubstr(c.expected));
  }
}

TEST(JobConfig, ValidateReportsEveryViolationAtOnce) {
  JobConfig cfg;
  cfg.training.batch_size = 0;
  cfg.training.dtype = "int8";
  cfg.validation.freq = -1;
  const std::string msg = error_of([&] { validate(cfg); });
  EXPECT_THAT(msg, HasSubstr("training.batch_size"));
  EXPECT_THAT(msg, HasSubstr("training.dtype"));
  EXPECT_THAT(msg, HasSubstr("validation.freq"));
}

// ParallelDims: TorchTitan's rank order, global rank = (replica x dp_shard + shard) x tp +
// tp rank, and every quantity derived from it agrees with that formula at every rank.
TEST(ParallelDims, RanksDecomposeInTorchTitansOrder) {
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> layouts = {{1, 1, 1}, {2, 1, 2}, {1, 2, 3},
                                                                      {2, 2, 2}, {3, 1, 1}, {1, 4, 1}};
  for (const auto& [dp, shard, tp] : layouts) {
    const ParallelDims d(dp, shard, tp);
    SCOPED_TRACE(d.describe());
    EXPECT_EQ(d.world_size(), dp * shard * tp);
    EXPECT_EQ(d.dp_ranks(), dp * shard);
    EXPECT_EQ(d.pieces(), shard * tp);
    int64_t rank = 0;
    for (int64_t r = 0; r < dp; ++r) {
      for (int64_t s = 0; s < shard; ++s) {
        for (int64_t t = 0; t < tp; ++t, ++rank) {
          EXPECT_EQ(d.replica_of(rank), r);
          EXPECT_EQ(d.shard_of(rank), s);
          EXPECT_EQ(d.tp_rank_of(rank), t);
          EXPECT_EQ(d.piece_of(rank), s * tp + t);
          EXPECT_EQ(d.dp_rank_of(rank), r * shard + s);
          EXPECT_EQ(d.rank_of(r, s * tp + t), rank);
        }
      }
    }
    EXPECT_EQ(d.tp_enabled(), tp > 1);
    EXPECT_EQ(d.fsdp_enabled(), shard > 1);
    EXPECT_EQ(d.dp_enabled(), dp * shard > 1);
  }
  EXPECT_EQ(ParallelDims(2, 2, 2).describe(), "dp 2 x fsdp 2 x tp 2");
  EXPECT_EQ(ParallelDims(1, 1, 4).describe(), "dp 1 x tp 4");
  JobConfig job;
  job.parallelism.data_parallel_degree = 3;
  job.parallelism.tensor_parallel_degree = 2;
  EXPECT_EQ(ParallelDims::of(job.parallelism), ParallelDims(3, 1, 2));
}

TEST(ParallelDims, RefusesADegreeBelowOneAndAWorldOfAnotherSize) {
  EXPECT_THAT([] { ParallelDims(1, 0, 2); }, ::testing::ThrowsMessage<std::invalid_argument>(
                                                 HasSubstr("parallelism.data_parallel_shard_degree = 0 must be >= 1")));
  try {
    ParallelDims(2, 2, 2).check_world_size(4);
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_THAT(what, HasSubstr("data_parallel_shard_degree x tensor_parallel_degree = 2 x 2 x 2 = 8 ranks"));
    EXPECT_THAT(what, HasSubstr("the job has 4"));
  }
  EXPECT_NO_THROW(ParallelDims(2, 2, 2).check_world_size(8));
}

}  // namespace job_config_test
