// JobConfig parsing: TOML file, command-line overrides, --help, to_toml and validate().
//
// One table of field descriptors (fields() below) drives the first four, so a key is
// declared exactly once; validate() holds the semantic rules that relate keys.
#include "hyper_parallel_train/config/job_config.h"

#include "compat/file_system.h"
#include "hyper_parallel/nn/activation_checkpoint.h"
#include "hyper_parallel/models/decoder_size_rules.h"
#include "hyper_parallel/models/model_registry.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

namespace hyper_parallel::train {
namespace {

// ---------------------------------------------------------------------------------------
// Field table
// ---------------------------------------------------------------------------------------

enum class Kind { Int, Float, Bool, String };
using Value = std::variant<int64_t, double, bool, std::string>;

struct Field {
  const char* section;
  const char* key;
  Kind kind;
  const char* help;
  std::function<Value(const JobConfig&)> get;
  std::function<void(JobConfig&, Value)> set;

  std::string dotted() const { return std::string(section) + "." + key; }
};

template <class T>
constexpr Kind kind_of() {
  if constexpr (std::is_same_v<T, bool>) {
    return Kind::Bool;
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return Kind::Int;
  } else if constexpr (std::is_same_v<T, double>) {
    return Kind::Float;
  } else {
    static_assert(std::is_same_v<T, std::string>, "unsupported JobConfig field type");
    return Kind::String;
  }
}

// A member of one of JobConfig's section structs: cfg.*section.*member.
template <class S, class M, class T>
Field section_field(const char* section, const char* key, S JobConfig::*sec, T M::*member, const char* help) {
  return Field{section,
               key,
               kind_of<T>(),
               help,
               [=](const JobConfig& c) { return Value(std::in_place_type<T>, (c.*sec).*member); },
               [=](JobConfig& c, Value v) { (c.*sec).*member = std::get<T>(std::move(v)); }};
}

// A member of a struct inside a section struct, keyed flat in the section: cfg.*section.*group.*member.
template <class S, class G, class M, class T>
Field group_field(const char* section, const char* key, S JobConfig::*sec, G S::*group, T M::*member,
                  const char* help) {
  return Field{section,
               key,
               kind_of<T>(),
               help,
               [=](const JobConfig& c) { return Value(std::in_place_type<T>, ((c.*sec).*group).*member); },
               [=](JobConfig& c, Value v) { ((c.*sec).*group).*member = std::get<T>(std::move(v)); }};
}

// A member of JobConfig itself (the [job] table).
template <class T>
Field job_field(const char* key, T JobConfig::*member, const char* help) {
  return Field{"job",
               key,
               kind_of<T>(),
               help,
               [=](const JobConfig& c) { return Value(std::in_place_type<T>, c.*member); },
               [=](JobConfig& c, Value v) { c.*member = std::get<T>(std::move(v)); }};
}

// The TOML section and key are the C++ member names, so they cannot drift apart.
#define HP_FIELD(section, key, help) \
  section_field(#section, #key, &JobConfig::section, &decltype(JobConfig::section)::key, help)
#define HP_GROUP_FIELD(section, group, key, help)                                        \
  group_field(#section, #key, &JobConfig::section, &decltype(JobConfig::section)::group, \
              &decltype(decltype(JobConfig::section)::group)::key, help)

// One table per section, in the order --help, to_toml and docs/config.md list them.
std::vector<Field> job_fields() {
  return {
      job_field("dump_folder", &JobConfig::dump_folder, "root folder of everything the run writes"),
      job_field("description", &JobConfig::description, "free text describing the job (not used)"),
  };
}

std::vector<Field> model_fields() {
  return {
      HP_FIELD(model, name,
               "model family: a registered name (the library's: llama, qwen3, gemma2; "
               "register_model_family adds others)"),
      HP_FIELD(model, dim, "hidden (embedding) size"),
      HP_FIELD(model, n_layers, "transformer blocks"),
      HP_FIELD(model, n_heads, "attention heads (divides dim; divisible by the TP degree)"),
      HP_FIELD(model, n_kv_heads,
               "key/value heads of grouped-query attention (divides n_heads; divisible by the TP degree); 0: n_heads"),
      HP_FIELD(model, head_dim, "size of one attention head (even, for RoPE); 0: dim / n_heads"),
      HP_FIELD(model, vocab_size, "token vocabulary size"),
      HP_FIELD(model, ffn_hidden_dim, "MLP hidden size; 0: 4*dim*2/3 rounded up to multiple_of"),
      HP_FIELD(model, multiple_of, "rounding of the derived ffn_hidden_dim"),
      HP_FIELD(model, norm_eps, "RMSNorm epsilon"),
      HP_FIELD(model, rope_theta, "RoPE base frequency"),
      HP_FIELD(model, max_seq_len, "longest sequence the RoPE tables cover"),
      HP_FIELD(model, tie_word_embeddings,
               "the output head is the token embedding's parameter (one [vocab, dim] tensor)"),
      HP_FIELD(model, hf_assets_path,
               "Hugging Face model folder: the model is built from its config.json, which sets the sizes above (one "
               "set to another value is an error); empty: the sizes above. Relative: to the working directory, as "
               "every path of a job config"),
  };
}

std::vector<Field> training_fields() {
  return {
      HP_FIELD(training, batch_size,
               "sequences per optimiser step, over all data-parallel replicas and micro-batches (every TP rank "
               "of a replica sees its rows)"),
      HP_FIELD(training, seq_len, "tokens per sequence (<= model.max_seq_len)"),
      HP_FIELD(training, steps, "optimiser steps in the run"),
      HP_FIELD(training, lr, "peak learning rate (AdamW); [lr_scheduler] shapes it over the steps"),
      HP_FIELD(training, weight_decay, "AdamW decoupled weight decay"),
      HP_FIELD(training, beta1, "AdamW beta1, in [0, 1)"),
      HP_FIELD(training, beta2, "AdamW beta2, in [0, 1)"),
      HP_FIELD(training, eps, "AdamW epsilon"),
      HP_FIELD(training, max_norm, "gradient-norm clipping threshold"),
      HP_FIELD(training, seed, "random seed (same on every rank)"),
      HP_FIELD(training, dtype,
               "parameter and compute dtype: float32 | bfloat16 (trained through float32 master weights) | float64"),
      HP_FIELD(training, device, "cpu | cuda (a GPU per rank over NCCL; HP_BACKEND=gloo lets ranks share one)"),
      HP_FIELD(training, data,
               "corpus to train on: a text file, a flat token .bin, or a Megatron .bin/.idx prefix; empty: "
               "built-in synthetic corpus"),
      HP_FIELD(training, data_format,
               "auto | text | bin_u16 | bin_u32 | megatron (auto: .idx or .bin beside one is Megatron, a .bin "
               "with a sidecar JSON is flat, else text)"),
      HP_FIELD(training, eos_id,
               "pre-tokenized data: end-of-document id, added after each Megatron document not ending with it; "
               "-1: the sidecar's"),
      HP_FIELD(training, bos_id,
               "pre-tokenized data: beginning-of-document id, added before each Megatron document not starting "
               "with it; -1: the sidecar's (none without one)"),
      HP_FIELD(training, log_freq, "log metrics every this many steps"),
      HP_FIELD(training, fused_linear_loss,
               "head matmul + cross-entropy fused, in chunks: no [tokens, vocab] logits tensor; needs loss parallel "
               "when tensor_parallel_degree > 1"),
      HP_GROUP_FIELD(training, loss_terms, z_loss_weight,
                     "z-loss: adds this x logsumexp(logits)^2 per counted token to the training loss (PaLM; e.g. 1e-4; "
                     "validation reports cross-entropy alone); 0: off"),
      HP_GROUP_FIELD(training, loss_terms, logit_softcap,
                     "> 0: logits become cap x tanh(logits / cap) before the loss, in training and validation (Gemma 2 "
                     "uses 30); 0: off"),
      HP_FIELD(training, caching_allocator,
               "CPU: large buffers from hp's caching, huge-page allocator (false: LibTorch's, which faults "
               "fresh pages in every step)"),
      HP_FIELD(training, grad_accum_steps,
               "micro-batches per step (gradients accumulate; batch_size is the total; the loss is normalised by "
               "the global count of target tokens)"),
      HP_FIELD(training, max_skipped_steps,
               "steps with a NaN/inf loss or gradient norm to skip in a row (weights untouched); 0: stop at the first"),
      HP_FIELD(training, mixed_precision_reduce,
               "FSDP in bfloat16: float32 | bfloat16, the dtype gradients are reduce-scattered in"),
  };
}

// TorchTitan's [lr_scheduler] keys, meaning what they mean there (train/optim/lr_scheduler.h).
std::vector<Field> lr_scheduler_fields() {
  return {
      HP_FIELD(lr_scheduler, warmup_steps,
               "linear warm-up: step s <= warmup_steps runs at lr x s / warmup_steps; more than training.steps is "
               "cut to training.steps (as TorchTitan does, said at start-up)"),
      HP_FIELD(lr_scheduler, decay_ratio,
               "the last round(decay_ratio x training.steps) steps decay (at most those after warm-up); the steps "
               "between warm-up and decay hold lr (warm-up-stable-decay). 1: decay right after warm-up, "
               "TorchTitan's None; 0: no decay; in [0, 1]"),
      HP_FIELD(lr_scheduler, decay_type, "linear | sqrt | cosine: the decay's curve from lr to min_lr_factor x lr"),
      HP_FIELD(lr_scheduler, min_lr_factor,
               "the decay ends at min_lr_factor x lr, one step after the last (TorchTitan's virtual last step); "
               "in [0, 1]"),
  };
}

std::vector<Field> parallelism_fields() {
  return {
      HP_FIELD(parallelism, tensor_parallel_degree, "tensor-parallel ranks"),
      HP_FIELD(parallelism, data_parallel_degree,
               "data-parallel replicas (DDP), each training on its rows of the global batch; world = data x shard x "
               "tensor parallel degree, global rank = (replica x shard + shard rank) x tp + tp rank (TorchTitan's "
               "order)"),
      HP_FIELD(parallelism, data_parallel_shard_degree,
               "FSDP ranks per replica (parameters, gradients, AdamW state sharded); world = data x shard x tensor "
               "parallel degree"),
      HP_FIELD(parallelism, fsdp_reshard_after_forward,
               "FSDP: free a block's gathered parameters after its forward (gather again for backward)"),
      HP_FIELD(parallelism, dp_bucket_mb,
               "MiB per data-parallel gradient all-reduce bucket; each is sent as soon as backward has produced it"),
      HP_FIELD(parallelism, disable_loss_parallel, "gather the logits instead of loss_parallel"),
      HP_FIELD(parallelism, sequence_parallel,
               "norms and residuals on sequence shards between the TP regions (needs tensor_parallel_degree > 1)"),
      HP_FIELD(parallelism, loss_parallel_strict_mesh, "loss_parallel: strict mesh checks"),
      HP_FIELD(parallelism, loss_parallel_fallback_on_layout_error,
               "cross_entropy on sharded logits it cannot take: gather instead of raising"),
  };
}

std::vector<Field> activation_checkpoint_fields() {
  return {
      HP_FIELD(activation_checkpoint, mode,
               "none | full | selective: which transformer blocks keep only their input and recompute their "
               "activations in backward (full: all; selective: see selective_ac_option)"),
      HP_FIELD(activation_checkpoint, selective_ac_option,
               "selective: a positive integer N, checkpointing every N-th block (blocks N, 2N, ... counting from "
               "1); TorchTitan's \"op\" (per-operator) is not supported"),
      HP_FIELD(activation_checkpoint, preserve_rng_state,
               "the recompute draws the random numbers the forward drew (generator states saved and restored); "
               "false: a checkpointed block that draws any is an error"),
  };
}

std::vector<Field> checkpoint_fields() {
  return {
      HP_FIELD(checkpoint, enable, "save checkpoints during the run"),
      HP_FIELD(checkpoint, folder, "checkpoint folder, relative to job.dump_folder"),
      HP_FIELD(checkpoint, interval, "save every this many steps, and at the last step"),
      HP_FIELD(checkpoint, resume, "resume from the latest checkpoint in the folder"),
      HP_FIELD(checkpoint, overwrite,
               "without resume, a folder that already holds checkpoints is an error (the earlier run's resume point "
               "would be lost); overwrite deletes them and starts over"),
      HP_FIELD(checkpoint, load_step, "with resume: the step to resume from; -1: the one `latest` names"),
      HP_FIELD(
          checkpoint, allow_data_change,
          "resume even though the data (corpus, tokenizer, seed, batch size, seq_len) differs from the checkpoint's"),
      HP_FIELD(checkpoint, initial_load_path,
               "folder whose weights a run starts from when it does not resume (a resume takes precedence); needs "
               "initial_load_in_hf"),
      HP_FIELD(checkpoint, initial_load_in_hf,
               "read the initial weights as a Hugging Face safetensors checkpoint: initial_load_path, or "
               "model.hf_assets_path when that is empty"),
      HP_FIELD(checkpoint, last_save_in_hf,
               "at the end of the run, also write the last checkpoint as a Hugging Face checkpoint in "
               "<job.dump_folder>/hf/step-<N> (needs checkpoint.enable)"),
      HP_FIELD(checkpoint, export_dtype, "float32 | bfloat16: the dtype of the last_save_in_hf weights"),
  };
}

std::vector<Field> validation_fields() {
  return {
      HP_FIELD(validation, enable, "run validation"),
      HP_FIELD(validation, freq, "validate every this many steps"),
      HP_FIELD(validation, steps, "batches per validation"),
  };
}

std::vector<Field> metrics_fields() {
  return {
      HP_FIELD(metrics, folder, "metrics folder, relative to job.dump_folder"),
      HP_FIELD(metrics, enable_plot, "also plot the logged metrics"),
      HP_FIELD(metrics, peak_tflops,
               "one rank's peak TFLOPs, the denominator of MFU; 0: measured at start-up by a timed matmul in "
               "training.dtype on the rank's device"),
  };
}

const std::vector<Field>& fields() {
  static const std::vector<Field> table = [] {
    std::vector<Field> all;
    for (auto section : {job_fields, model_fields, training_fields, lr_scheduler_fields, parallelism_fields,
                         activation_checkpoint_fields, checkpoint_fields, validation_fields, metrics_fields}) {
      for (Field& f : section()) all.push_back(std::move(f));
    }
    return all;
  }();
  return table;
}

#undef HP_FIELD
#undef HP_GROUP_FIELD

// Section names in declaration order.
const std::vector<std::string>& sections() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Field& f : fields()) {
      if (std::find(out.begin(), out.end(), f.section) == out.end()) out.emplace_back(f.section);
    }
    return out;
  }();
  return names;
}

bool is_section(const std::string& name) {
  const auto& s = sections();
  return std::find(s.begin(), s.end(), name) != s.end();
}

const Field* find_field(const std::string& section, const std::string& key) {
  for (const Field& f : fields()) {
    if (section == f.section && key == f.key) return &f;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string known_keys(const std::string& section) {
  std::vector<std::string> keys;
  for (const Field& f : fields()) {
    if (section == f.section) keys.emplace_back(f.key);
  }
  return "known keys in [" + section + "]: " + join(keys, ", ");
}

std::string known_sections() { return "known sections: " + join(sections(), ", "); }

// Optimal-string-alignment distance: Levenshtein plus a swap of two neighbouring
// letters as one edit, the commonest typo ("stpes" for "steps").
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// "; did you mean 'section.key'?" for a key that exists in other sections, else for a
// near miss (typo) of a key; empty when nothing is close.
std::string suggestion(const std::string& section, const std::string& key) {
  std::vector<std::string> elsewhere;
  for (const Field& f : fields()) {
    if (key == f.key && section != f.section) elsewhere.push_back("'" + f.dotted() + "'");
  }
  if (!elsewhere.empty()) return "; did you mean " + join(elsewhere, " or ") + "?";
  const Field* best = nullptr;
  size_t best_distance = std::max<size_t>(1, std::min<size_t>(2, key.size() / 3)) + 1;
  for (const Field& f : fields()) {
    if (is_section(section) && section != f.section) continue;
    const size_t d = edit_distance(key, f.key);
    if (d < best_distance) best = &f, best_distance = d;
  }
  return best ? "; did you mean '" + best->dotted() + "'?" : "";
}

// Keys that were hp-train's own before [lr_scheduler] took TorchTitan's: one name per
// setting, so the old spelling is an error that names the new one.
std::optional<std::string> moved_key(const std::string& dotted) {
  if (dotted == "training.warmup_steps") return "lr_scheduler.warmup_steps";
  if (dotted == "training.min_lr_ratio") return "lr_scheduler.min_lr_factor";
  return std::nullopt;
}

// `unknown key 'training.lrr' (known keys in [training]: ...)` or the section equivalent.
std::string unknown_message(const std::string& section, const std::string& key) {
  if (const auto moved = moved_key(section + "." + key)) {
    return "'" + section + "." + key + "' is now '" + *moved + "' (TorchTitan's [lr_scheduler] section)";
  }
  if (!is_section(section)) {
    return "unknown section '" + section + "' in '" + section + "." + key + "' (" + known_sections() + ")" +
           suggestion(section, key);
  }
  return "unknown key '" + section + "." + key + "' (" + known_keys(section) + ")" + suggestion(section, key);
}

const char* expected(Kind kind) {
  switch (kind) {
    case Kind::Int:
      return "an integer";
    case Kind::Float:
      return "a number";
    case Kind::Bool:
      return "a boolean";
    case Kind::String:
      return "a string";
  }
  return "?";
}

const char* type_name(Kind kind) {
  switch (kind) {
    case Kind::Int:
      return "INT";
    case Kind::Float:
      return "FLOAT";
    case Kind::Bool:
      return "BOOL";
    case Kind::String:
      return "STRING";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------
// Values as TOML text
// ---------------------------------------------------------------------------------------

// A TOML basic string: quoted, with the escapes TOML requires.
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// Shortest text that reads back as the same double, and as a TOML float (not an integer).
std::string format_float(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // 'n': inf, nan
  return s;
}

std::string format_value(const Value& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) {
          return x ? "true" : "false";
        } else if constexpr (std::is_same_v<T, int64_t>) {
          return std::to_string(x);
        } else if constexpr (std::is_same_v<T, double>) {
          return format_float(x);
        } else {
          return quote(x);
        }
      },
      v);
}

// What a TOML node holds, for "expected ..., got <this>".
std::string describe(const toml::node& node) {
  if (const auto* s = node.as_string()) return "string " + quote(s->get());
  if (const auto* i = node.as_integer()) return "integer " + std::to_string(i->get());
  if (const auto* f = node.as_floating_point()) return "float " + format_float(f->get());
  if (const auto* b = node.as_boolean()) return std::string("boolean ") + (b->get() ? "true" : "false");
  if (node.is_table()) return "a table";
  std::ostringstream os;  // arrays, dates and times: toml++ prints them as TOML
  node.visit([&os](const auto& n) { os << n; });
  return (node.is_array() ? "array " : "date/time ") + os.str();
}

// ---------------------------------------------------------------------------------------
// Reading values
// ---------------------------------------------------------------------------------------

std::optional<Value> from_node(const toml::node& node, Kind kind) {
  switch (kind) {
    case Kind::Int:
      if (const auto* i = node.as_integer()) return Value(std::in_place_type<int64_t>, i->get());
      break;
    case Kind::Float:  // TOML integers are fine where a float is expected (lr = 1)
      if (const auto* f = node.as_floating_point()) return Value(std::in_place_type<double>, f->get());
      if (const auto* i = node.as_integer()) {
        return Value(std::in_place_type<double>, static_cast<double>(i->get()));
      }
      break;
    case Kind::Bool:
      if (const auto* b = node.as_boolean()) return Value(std::in_place_type<bool>, b->get());
      break;
    case Kind::String:
      if (const auto* s = node.as_string()) return Value(std::in_place_type<std::string>, s->get());
      break;
  }
  return std::nullopt;
}

// Command-line text per the field's type; whole-string parses only, so "10x" or " 10"
// is an error rather than 10.
std::optional<Value> from_text(const std::string& text, Kind kind) {
  switch (kind) {
    case Kind::Int: {
      const char* first = text.data();
      const char* last = first + text.size();
      if (first != last && *first == '+') ++first;
      int64_t v = 0;
      const auto res = std::from_chars(first, last, v);
      if (first != last && res.ec == std::errc() && res.ptr == last) {
        return Value(std::in_place_type<int64_t>, v);
      }
      break;
    }
    case Kind::Float: {
      const char* first = text.data();
      const char* last = first + text.size();
      if (first != last && *first == '+') ++first;
      double v = 0;
      const auto res = std::from_chars(first, last, v);
      if (first != last && res.ec == std::errc() && res.ptr == last) {
        return Value(std::in_place_type<double>, v);
      }
      break;
    }
    case Kind::Bool:
      if (text == "true" || text == "1") return Value(std::in_place_type<bool>, true);
      if (text == "false" || text == "0") return Value(std::in_place_type<bool>, false);
      break;
    case Kind::String:
      return Value(std::in_place_type<std::string>, text);
  }
  return std::nullopt;
}

// Command-line spelling: "--training.batch-size" names training.batch_size.
std::string normalize_key(std::string key) {
  if (key.rfind("--", 0) == 0) key.erase(0, 2);
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

// The field a command-line key names; throws naming the flag as the user typed it.
const Field& lookup_flag(const std::string& flag, const std::string& dotted) {
  const auto dot = dotted.find('.');
  if (dot == std::string::npos) {
    throw std::invalid_argument(flag +
                                ": unknown option; expected --config FILE, --help or "
                                "--section.key VALUE (" +
                                known_sections() + ")" + suggestion("", dotted));
  }
  const std::string section = dotted.substr(0, dot);
  const std::string key = dotted.substr(dot + 1);
  const Field* f = find_field(section, key);
  if (!f) throw std::invalid_argument(flag + ": " + unknown_message(section, key));
  return *f;
}

void apply_toml(JobConfig& cfg, const toml::table& root, const std::string& file) {
  for (const auto& [section_key, node] : root) {
    const std::string section(section_key.str());
    if (!is_section(section)) {
      if (node.is_table()) {
        throw std::invalid_argument(file + ": unknown section [" + section + "] (" + known_sections() + ")" +
                                    suggestion("", section));
      }
      throw std::invalid_argument(file + ": unknown key '" + section + "' outside any section (" + known_sections() +
                                  ")" + suggestion("", section));
    }
    const toml::table* table = node.as_table();
    if (!table) {
      throw std::invalid_argument(file + ": " + section + ": expected a table [" + section + "], got " +
                                  describe(node));
    }
    for (const auto& [key_node, value] : *table) {
      const std::string key(key_node.str());
      const Field* f = find_field(section, key);
      if (!f) throw std::invalid_argument(file + ": " + unknown_message(section, key));
      auto v = from_node(value, f->kind);
      if (!v) {
        throw std::invalid_argument(file + ": " + f->dotted() + ": expected " + expected(f->kind) + ", got " +
                                    describe(value));
      }
      f->set(cfg, std::move(*v));
    }
  }
}

bool is_flag(const std::string& arg) { return arg.rfind("--", 0) == 0; }

}  // namespace

// ---------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------

std::string job_folder(const JobConfig& cfg, const std::string& folder) {
  return folder.empty() || folder[0] == '/' ? folder : cfg.dump_folder + "/" + folder;
}

std::string hf_export_folder(const JobConfig& cfg, int64_t step) {
  return job_folder(cfg, "hf") + "/step-" + std::to_string(step);
}

JobConfig load_job_config_file(const std::string& path) {
  if (!compat::path_exists(path)) {
    throw std::invalid_argument(path + ": job config file not found");
  }
  if (compat::is_directory(path)) {
    throw std::invalid_argument(path + ": is a directory, not a job config file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(path + ": cannot read the job config file");
  std::ostringstream text;
  text << in.rdbuf();

  toml::table root;
  try {
    root = toml::parse(text.str(), path);
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    throw std::invalid_argument(path + ": invalid TOML at line " + std::to_string(at.line) + ", column " +
                                std::to_string(at.column) + ": " + std::string(e.description()));
  }
  JobConfig cfg;
  apply_toml(cfg, root, path);
  cfg.config_file = path;
  return cfg;
}

void apply_override(JobConfig& cfg, const std::string& dotted_key, const std::string& value) {
  const std::string flag = dotted_key.rfind("--", 0) == 0 ? dotted_key : "--" + dotted_key;
  const Field& f = lookup_flag(flag, normalize_key(dotted_key));
  auto v = from_text(value, f.kind);
  if (!v) {
    throw std::invalid_argument(flag + ": expected " + std::string(expected(f.kind)) + ", got " + quote(value));
  }
  f.set(cfg, std::move(*v));
}

JobConfig parse_job_config(const std::vector<std::string>& args, bool* help) {
  if (help) *help = false;
  // --help wins over everything, even arguments that would not parse.
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      if (help) *help = true;
      return JobConfig{};
    }
  }

  // Pass 1: split flags from values and check every key before touching the file.
  std::optional<std::string> config_file;
  std::vector<std::pair<std::string, std::string>> overrides;  // (flag, value)
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!is_flag(arg)) {
      throw std::invalid_argument("unexpected argument '" + arg +
                                  "' (expected --config FILE or --section.key VALUE; see --help)");
    }
    std::string flag = arg;
    std::optional<std::string> value;
    if (const auto eq = arg.find('='); eq != std::string::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    const std::string key = normalize_key(flag);
    const bool is_config = key == "config" || key == "job.config_file";
    const Field* field = is_config ? nullptr : &lookup_flag(flag, key);
    if (!value) {
      if (i + 1 < args.size() && !is_flag(args[i + 1])) {
        value = args[++i];
      } else if (field && field->kind == Kind::Bool) {
        value = "true";  // a bare bool flag: --checkpoint.resume
      } else {
        throw std::invalid_argument(flag + ": missing value (expected " +
                                    (field ? expected(field->kind) : "a file path") + ")");
      }
    }
    if (is_config) {
      if (config_file) {
        throw std::invalid_argument(flag + ": a job config file was already given (" + *config_file + ")");
      }
      config_file = *value;
    } else {
      overrides.emplace_back(flag, *value);
    }
  }

  // Pass 2: the file, then the overrides in command-line order.
  JobConfig cfg = config_file ? load_job_config_file(*config_file) : JobConfig{};
  for (const auto& [flag, value] : overrides) apply_override(cfg, flag, value);
  validate(cfg);
  return cfg;
}

JobConfig parse_job_config(int argc, const char* const* argv, bool* help) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_job_config(args, help);
}

std::string job_config_reference() {
  const JobConfig defaults;
  std::ostringstream os;
  os << "# hp-train job configuration\n\n"
        "Every key of a job, with its type, default and meaning. Generated from the field table in\n"
        "`src/train/config/job_config.cpp` by `build/bin/hp-train --config-reference > docs/config.md`\n"
        "(the test `Docs.ConfigReferenceIsGeneratedFromTheFieldTable` fails when it is stale); do not\n"
        "edit it by hand. How to run a job: [training.md](training.md).\n\n"
        "A key is set in the job's TOML file, `[section]` then `key = value`, or on the command line\n"
        "as `--section.key VALUE` (or `--section.key=VALUE`), applied after the file in order. A\n"
        "`bool` flag alone (`--checkpoint.resume`) means true. Folders in `[checkpoint]` and\n"
        "`[metrics]` are relative to `job.dump_folder` unless absolute.\n";
  const auto& all = fields();
  for (size_t i = 0; i < all.size(); ++i) {
    const Field& f = all[i];
    if (i == 0 || std::string(all[i - 1].section) != f.section) {
      os << "\n## [" << f.section << "]\n\n| key | type | default | meaning |\n|---|---|---|---|\n";
    }
    std::string help = f.help;
    for (size_t at = 0; (at = help.find('|', at)) != std::string::npos; at += 2) help.replace(at, 1, "\\|");
    os << "| `" << f.key << "` | " << type_name(f.kind) << " | `" << format_value(f.get(defaults)) << "` | " << help
       << " |\n";
  }
  return os.str();
}

std::string job_config_usage() {
  const JobConfig defaults;
  struct Row {
    std::string flag, fallback;
    const char* help;
  };
  std::ostringstream os;
  os << "Usage: hp-train [--config FILE] [--section.key VALUE | --section.key=VALUE]...\n\n"
        "  --config FILE   TOML job file (e.g. configs/debug_model.toml); without it, the\n"
        "                  defaults below. Overrides apply after the file, in order.\n"
        "  --help, -h      print this help\n"
        "  --config-reference\n"
        "                  print this as Markdown (docs/config.md)\n\n"
        "A BOOL flag alone (--checkpoint.resume) means true; BOOL values: true false 1 0.\n"
        "Folders in [checkpoint] and [metrics] are relative to job.dump_folder.\n";
  const auto& all = fields();
  for (size_t begin = 0; begin < all.size();) {
    // One section at a time, its columns aligned to its own longest flag.
    size_t end = begin;
    std::vector<Row> rows;
    size_t flag_width = 0;
    size_t default_width = 0;
    for (; end < all.size() && std::string(all[end].section) == all[begin].section; ++end) {
      const Field& f = all[end];
      rows.push_back({"--" + f.dotted() + " " + type_name(f.kind), "default " + format_value(f.get(defaults)), f.help});
      flag_width = std::max(flag_width, rows.back().flag.size());
      default_width = std::max(default_width, rows.back().fallback.size());
    }
    os << "\n[" << all[begin].section << "]\n";
    for (const Row& r : rows) {
      os << "  " << r.flag << std::string(flag_width - r.flag.size() + 2, ' ') << r.fallback
         << std::string(default_width - r.fallback.size() + 2, ' ') << r.help << "\n";
    }
    if (std::string(all[begin].section) == "model") {
      std::string names;
      for (const auto& n : model_family_names()) names += (names.empty() ? "" : ", ") + n;
      os << "  (model.name: registered in this process: " << names << ")\n";
    }
    begin = end;
  }
  return os.str();
}

std::string to_toml(const JobConfig& cfg) {
  std::ostringstream os;
  os << "# hp-train job configuration (written by to_toml)\n";
  const char* current = nullptr;
  for (const Field& f : fields()) {
    if (!current || std::string(current) != f.section) {
      os << (current ? "\n" : "") << "[" << f.section << "]\n";
      current = f.section;
    }
    os << f.key << " = " << format_value(f.get(cfg)) << "\n";
  }
  return os.str();
}

namespace {

// The violations validate() finds, each naming its key; all of them are reported at once.
struct Checks {
  std::vector<std::string> errors;
  void require(bool ok, std::string message) {
    if (!ok) errors.push_back(std::move(message));
  }
  void positive(const char* key, int64_t v) {
    require(v > 0, std::string(key) + " = " + std::to_string(v) + " must be > 0");
  }
  void non_empty(const char* key, const std::string& v) {
    require(!v.empty(), std::string(key) + " must not be empty");
  }
};

std::string num(double v) { return format_float(v); }

// A Hugging Face model's sizes are not known before the train spec builds it from its config.json.
bool model_sizes_known(const ModelConfig& m) { return m.hf_assets_path.empty() || m.hf_sizes_applied; }

// The family's shape rules (ModelFamily::size_errors, tp_size_errors); the decoder's where the
// family gives none or is not known (that is reported on its own).
std::vector<std::string> family_size_errors(const ModelConfig& m, std::optional<int64_t> tp) {
  const ModelFamily* family = nullptr;
  try {
    if (!m.name.empty()) family = &model_family(m.name);
  } catch (const std::invalid_argument&) {
  }
  if (tp) return family && family->tp_size_errors ? family->tp_size_errors(m, *tp) : decoder_tp_size_errors(m, *tp);
  return family && family->size_errors ? family->size_errors(m) : decoder_size_errors(m);
}

void append(std::vector<std::string>& to, const std::vector<std::string>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

// Every float finite; [job] and [model].
void check_model(const JobConfig& cfg, Checks& out) {
  // TOML and the command line both accept inf and nan; no float key has a use for them.
  for (const Field& f : fields()) {
    if (f.kind != Kind::Float) continue;
    const double v = std::get<double>(f.get(cfg));
    out.require(std::isfinite(v), f.dotted() + " = " + num(v) + " must be finite");
  }

  out.non_empty("job.dump_folder", cfg.dump_folder);

  const ModelConfig& m = cfg.model;
  out.non_empty("model.name", m.name);
  if (!m.name.empty()) {
    try {
      model_family(m.name);  // an unknown family is refused, never trained as another
    } catch (const std::invalid_argument& e) {
      out.errors.push_back("model.name = \"" + m.name + "\": " + e.what());
    }
  }
  out.positive("model.dim", m.dim);
  out.positive("model.n_layers", m.n_layers);
  out.positive("model.n_heads", m.n_heads);
  out.positive("model.vocab_size", m.vocab_size);
  out.positive("model.multiple_of", m.multiple_of);
  out.positive("model.max_seq_len", m.max_seq_len);
  out.require(m.ffn_hidden_dim >= 0, "model.ffn_hidden_dim = " + std::to_string(m.ffn_hidden_dim) +
                                         " must be >= 0 (0: derived from model.dim)");
  out.require(m.n_kv_heads >= 0, "model.n_kv_heads = " + std::to_string(m.n_kv_heads) + " must be >= 0 (0: n_heads)");
  out.require(m.head_dim >= 0, "model.head_dim = " + std::to_string(m.head_dim) + " must be >= 0 (0: dim / n_heads)");
  // A Hugging Face config's sizes are checked by its family when it is read.
  if (m.hf_assets_path.empty()) append(out.errors, family_size_errors(m, std::nullopt));
  out.require(m.norm_eps > 0, "model.norm_eps = " + num(m.norm_eps) + " must be > 0");
  out.require(m.rope_theta > 0, "model.rope_theta = " + num(m.rope_theta) + " must be > 0");
}

// [training]: the optimiser, the schedule and the data.
void check_training(const JobConfig& cfg, Checks& out) {
  const ModelConfig& m = cfg.model;
  const TrainingConfig& t = cfg.training;
  out.positive("training.batch_size", t.batch_size);
  out.positive("training.seq_len", t.seq_len);
  out.positive("training.steps", t.steps);
  out.positive("training.log_freq", t.log_freq);
  const bool sizes_known = model_sizes_known(m);
  out.require(!sizes_known || t.seq_len <= m.max_seq_len,
              "training.seq_len = " + std::to_string(t.seq_len) +
                  " must be <= model.max_seq_len = " + std::to_string(m.max_seq_len));
  out.require(t.lr > 0, "training.lr = " + num(t.lr) + " must be > 0");
  out.require(t.weight_decay >= 0, "training.weight_decay = " + num(t.weight_decay) + " must be >= 0");
  out.require(t.beta1 >= 0 && t.beta1 < 1, "training.beta1 = " + num(t.beta1) + " must be in [0, 1)");
  out.require(t.beta2 >= 0 && t.beta2 < 1, "training.beta2 = " + num(t.beta2) + " must be in [0, 1)");
  out.require(t.eps > 0, "training.eps = " + num(t.eps) + " must be > 0");
  out.require(t.max_norm > 0, "training.max_norm = " + num(t.max_norm) + " must be > 0");
  const LossTerms& terms = t.loss_terms;
  out.require(terms.z_loss_weight >= 0,
              "training.z_loss_weight = " + num(terms.z_loss_weight) + " must be >= 0 (0: off)");
  out.require(terms.logit_softcap >= 0,
              "training.logit_softcap = " + num(terms.logit_softcap) + " must be >= 0 (0: off)");
  out.require(t.seed >= 0, "training.seed = " + std::to_string(t.seed) + " must be >= 0");
  out.require(t.dtype == "float32" || t.dtype == "bfloat16" || t.dtype == "float64",
              "training.dtype = " + quote(t.dtype) + " is not one of float32, bfloat16, float64");
  out.require(t.device == "cpu" || t.device == "cuda",
              "training.device = " + quote(t.device) + " is not one of cpu, cuda");
  const std::string& f = t.data_format;
  out.require(f == "auto" || f == "text" || f == "bin_u16" || f == "bin_u32" || f == "megatron",
              "training.data_format = " + quote(f) + " is not one of auto, text, bin_u16, bin_u32, megatron");
  out.require(f == "auto" || !t.data.empty(),
              "training.data_format = " + quote(f) + " needs training.data (empty: the built-in synthetic corpus)");
  for (const auto& [key, id] : {std::pair{"training.eos_id", t.eos_id}, std::pair{"training.bos_id", t.bos_id}}) {
    out.require(id >= -1 && (m.vocab_size <= 0 || !sizes_known || id < m.vocab_size),
                std::string(key) + " = " + std::to_string(id) +
                    " must be -1 (none / the sidecar's) or an id below "
                    "model.vocab_size = " +
                    std::to_string(m.vocab_size));
    // The word-level text vocabulary and the synthetic language have no such ids: a set
    // one would be silently ignored.
    out.require(id == -1 || (!t.data.empty() && f != "text"),
                std::string(key) + " = " + std::to_string(id) +
                    " applies to pre-tokenized data (training.data_format "
                    "bin_u16, bin_u32, megatron or auto on such a file), not to " +
                    (t.data.empty() ? std::string("the synthetic corpus") : std::string("a text corpus")));
  }
}

// [lr_scheduler]: TorchTitan's keys, in the ranges its formula is meant for.
void check_lr_scheduler(const LrSchedulerConfig& s, Checks& out) {
  out.require(s.warmup_steps >= 0, "lr_scheduler.warmup_steps = " + std::to_string(s.warmup_steps) + " must be >= 0");
  out.require(s.decay_ratio >= 0 && s.decay_ratio <= 1,
              "lr_scheduler.decay_ratio = " + num(s.decay_ratio) + " must be in [0, 1] (1: decay right after warm-up)");
  out.require(s.decay_type == "linear" || s.decay_type == "sqrt" || s.decay_type == "cosine",
              "lr_scheduler.decay_type = " + quote(s.decay_type) + " is not one of linear, sqrt, cosine");
  out.require(s.min_lr_factor >= 0 && s.min_lr_factor <= 1,
              "lr_scheduler.min_lr_factor = " + num(s.min_lr_factor) + " must be in [0, 1]");
}

// [parallelism], and what the layout asks of the batch and the loss.
void check_parallelism(const JobConfig& cfg, Checks& out) {
  const ModelConfig& m = cfg.model;
  const TrainingConfig& t = cfg.training;
  const bool sizes_known = model_sizes_known(m);
  const int64_t tp = cfg.parallelism.tensor_parallel_degree;
  out.require(tp >= 1, "parallelism.tensor_parallel_degree = " + std::to_string(tp) + " must be >= 1");
  if (sizes_known) append(out.errors, family_size_errors(m, tp));
  const int64_t dp = cfg.parallelism.data_parallel_degree;
  out.require(dp >= 1, "parallelism.data_parallel_degree = " + std::to_string(dp) + " must be >= 1");
  const int64_t shard = cfg.parallelism.data_parallel_shard_degree;
  out.require(shard >= 1, "parallelism.data_parallel_shard_degree = " + std::to_string(shard) + " must be >= 1");
  out.positive("parallelism.dp_bucket_mb", cfg.parallelism.dp_bucket_mb);
  out.positive("training.grad_accum_steps", t.grad_accum_steps);
  if (dp >= 1 && shard >= 1 && t.grad_accum_steps >= 1 && t.batch_size > 0) {  // whole rows per micro-batch
    out.require(t.batch_size % (dp * shard * t.grad_accum_steps) == 0,
                "training.batch_size = " + std::to_string(t.batch_size) + " must be divisible by parallelism." +
                    (shard > 1 ? "data_parallel_degree x data_parallel_shard_degree x training.grad_accum_steps = " +
                                     std::to_string(dp) + " x " + std::to_string(shard)
                               : "data_parallel_degree x training.grad_accum_steps = " + std::to_string(dp)) +
                    " x " + std::to_string(t.grad_accum_steps) +
                    " (each data-parallel rank's micro-batch holds whole sequences)");
  }
  out.require(
      t.mixed_precision_reduce == "float32" || t.mixed_precision_reduce == "bfloat16",
      "training.mixed_precision_reduce = " + quote(t.mixed_precision_reduce) + " is not one of float32, bfloat16");
  if (shard > 1) {
    // Sharding is for state too large to replicate; replicated vocabulary logits (batch x
    // seq x vocab per rank, what loss_parallel avoids) contradict it.
    out.require(!cfg.parallelism.disable_loss_parallel,
                "parallelism.data_parallel_shard_degree = " + std::to_string(shard) +
                    " (FSDP) with parallelism.disable_loss_parallel = true: FSDP keeps loss parallel on; unset "
                    "disable_loss_parallel or set data_parallel_shard_degree = 1");
    out.require(!(t.mixed_precision_reduce == "bfloat16" && t.device == "cpu"),
                "training.mixed_precision_reduce = \"bfloat16\" needs training.device = \"cuda\" (NCCL): Gloo cannot "
                "sum bfloat16; use float32");
  }
  // At TP 1 there is nothing to split the sequence over: accepting it would report a
  // sequence-parallel run that is not one.
  out.require(!(cfg.parallelism.sequence_parallel && tp == 1),
              "parallelism.sequence_parallel = true needs parallelism.tensor_parallel_degree > 1 (it splits the "
              "sequence over the tensor-parallel ranks); unset it at tensor_parallel_degree = 1");
  // The fused head + loss is vocabulary-parallel itself; a replicated head contradicts it.
  out.require(!(t.fused_linear_loss && tp > 1 && cfg.parallelism.disable_loss_parallel),
              "training.fused_linear_loss = true needs loss parallel at parallelism.tensor_parallel_degree = " +
                  std::to_string(tp) + "; unset parallelism.disable_loss_parallel or training.fused_linear_loss");
}

// [activation_checkpoint]: the library's reading of TorchTitan's keys says what is wrong.
void check_activation_checkpoint(const JobConfig& cfg, Checks& out) {
  const ActivationCheckpointJobConfig& ac = cfg.activation_checkpoint;
  try {
    block_checkpointing(ac.mode, ac.selective_ac_option, ac.preserve_rng_state);
  } catch (const std::invalid_argument& e) {
    out.require(false, e.what());
  }
}

// [checkpoint], [validation], [metrics].
void check_outputs(const JobConfig& cfg, Checks& out) {
  const ModelConfig& m = cfg.model;
  const TrainingConfig& t = cfg.training;
  out.non_empty("checkpoint.folder", cfg.checkpoint.folder);
  out.require(!(cfg.checkpoint.resume && cfg.checkpoint.overwrite),
              "checkpoint.resume and checkpoint.overwrite contradict each other: resume continues the "
              "checkpoints in the folder, overwrite deletes them; choose one");
  out.positive("checkpoint.interval", cfg.checkpoint.interval);
  out.require(cfg.checkpoint.load_step >= -1,
              "checkpoint.load_step = " + std::to_string(cfg.checkpoint.load_step) + " must be >= 0 (or -1: latest)");
  out.require(cfg.checkpoint.load_step == -1 || cfg.checkpoint.resume,
              "checkpoint.load_step = " + std::to_string(cfg.checkpoint.load_step) +
                  " needs checkpoint.resume = true (it names the step to resume from)");
  const CheckpointConfig& c = cfg.checkpoint;
  out.require(
      c.initial_load_path.empty() || c.initial_load_in_hf,
      "checkpoint.initial_load_path = " + quote(c.initial_load_path) +
          " is only read as a Hugging Face checkpoint: set checkpoint.initial_load_in_hf = true for one; starting "
          "from one of hp-train's own checkpoints is not supported this way, use checkpoint.resume (with "
          "checkpoint.folder pointing at it)");
  out.require(!c.initial_load_in_hf || !m.hf_assets_path.empty(),
              "checkpoint.initial_load_in_hf = true needs model.hf_assets_path (the folder with the model's "
              "config.json, often the checkpoint's own folder): the model must be the checkpoint's");
  out.require(!c.last_save_in_hf || c.enable,
              "checkpoint.last_save_in_hf = true needs checkpoint.enable = true (the Hugging Face checkpoint is "
              "written from the run's last checkpoint)");
  out.require(c.export_dtype == "float32" || c.export_dtype == "bfloat16",
              "checkpoint.export_dtype = " + quote(c.export_dtype) + " is not one of float32, bfloat16");
  out.require(t.max_skipped_steps >= 0,
              "training.max_skipped_steps = " + std::to_string(t.max_skipped_steps) + " must be >= 0");
  out.positive("validation.freq", cfg.validation.freq);
  out.positive("validation.steps", cfg.validation.steps);
  out.non_empty("metrics.folder", cfg.metrics.folder);
  out.require(cfg.metrics.peak_tflops >= 0,
              "metrics.peak_tflops = " + num(cfg.metrics.peak_tflops) + " must be >= 0 (0: measured at start-up)");
}

}  // namespace

void validate(const JobConfig& cfg) {
  Checks out;
  check_model(cfg, out);
  check_training(cfg, out);
  check_lr_scheduler(cfg.lr_scheduler, out);
  check_parallelism(cfg, out);
  check_activation_checkpoint(cfg, out);
  check_outputs(cfg, out);
  if (!out.errors.empty()) throw std::invalid_argument("invalid job config: " + join(out.errors, "; "));
}

}  // namespace hyper_parallel::train
