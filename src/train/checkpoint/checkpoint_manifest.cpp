// checkpoint_manifest.cpp — identities, manifests and the checks of a resume.
#include "train/checkpoint/checkpoint_manifest.h"

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <type_traits>

#include "compat/file_system.h"
#include "io/crc32c.h"
#include "io/whole_file.h"

namespace hyper_parallel::train {
namespace {

constexpr const char* kManifestFormat = "hyper_parallel.checkpoint_manifest.v1";

std::string fnv1a_hex(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) throw std::runtime_error(where + ": missing field '" + key + "'");
  const auto wrong_type = [&] {
    return std::runtime_error(where + ": field '" + std::string(key) + "' has the wrong type (" + it->dump() + ")");
  };
  if constexpr (std::is_same_v<T, int64_t>) {
    // nlohmann's get<int64_t>() converts a float (2.5 -> 2; 1e300 is undefined
    // behaviour) and wraps an unsigned above 2^63 - 1: an integer must be written as one.
    if (it->is_number_unsigned() ? it->get<uint64_t>() > uint64_t{INT64_MAX} : !it->is_number_integer()) {
      throw wrong_type();
    }
  }
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw wrong_type();
  }
}

uint32_t parse_crc(const std::string& hex, const std::string& where) {
  char* end = nullptr;
  const unsigned long v = std::strtoul(hex.c_str(), &end, 16);
  if (hex.size() != 8 || !end || *end != '\0') throw std::runtime_error(where + ": malformed crc32c '" + hex + "'");
  return static_cast<uint32_t>(v);
}

// The first way in which `file_id` (from a rank file) is not the manifest's run,
// step and the rank it is stored as; empty when it is.
std::string identity_problem(const CheckpointIdentity& file_id, int64_t file_rank, const CheckpointIdentity& want,
                             int64_t want_rank) {
  if (file_id.run_id != want.run_id) {
    return "it belongs to run " + file_id.run_id + ", the step to run " + want.run_id +
           " (a file of another run was left or copied here)";
  }
  if (file_id.step != want.step) {
    return "it was saved at step " + std::to_string(file_id.step) + ", not step " + std::to_string(want.step) +
           " (copied from another step folder)";
  }
  if (file_rank != want_rank) {
    return "it holds rank " + std::to_string(file_rank) + "'s state, not rank " + std::to_string(want_rank) +
           "'s (rank files swapped or renamed)";
  }
  const auto mismatches = resume_mismatches(file_id, want);
  if (!mismatches.empty()) return "its layout differs from the step's: " + mismatches.front();
  return "";
}

CheckpointIdentity rank_file_identity(const std::string& metadata_json, const std::string& path, int64_t* rank) {
  nlohmann::json meta = nlohmann::json::parse(metadata_json, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object()) {
    throw std::runtime_error("checkpoint file '" + path + "': its metadata is not a JSON object");
  }
  *rank = field<int64_t>(meta, "rank", "checkpoint file '" + path + "'");
  return identity_from_json(meta, "checkpoint file '" + path + "'");
}

}  // namespace

std::string CheckpointIdentity::config_hash() const { return fnv1a_hex(model.dump() + "|" + dtype); }

nlohmann::json to_json(const CheckpointIdentity& id) {
  nlohmann::json j = {{"run_id", id.run_id},
                      {"step", id.step},
                      {"world_size", id.world_size},
                      {"tensor_parallel_degree", id.tensor_parallel_degree},
                      {"data_parallel_degree", id.data_parallel_degree},
                      {"dtype", id.dtype},
                      {"model", id.model},
                      {"config_hash", id.config_hash()}};
  if (!id.data.is_null()) j["data"] = id.data;
  if (id.data_parallel_shard_degree != 1) j["data_parallel_shard_degree"] = id.data_parallel_shard_degree;
  return j;
}

CheckpointIdentity identity_from_json(const nlohmann::json& j, const std::string& where) {
  CheckpointIdentity id;
  id.run_id = field<std::string>(j, "run_id", where);
  id.step = field<int64_t>(j, "step", where);
  id.world_size = field<int64_t>(j, "world_size", where);
  id.tensor_parallel_degree = field<int64_t>(j, "tensor_parallel_degree", where);
  id.data_parallel_degree = field<int64_t>(j, "data_parallel_degree", where);
  if (j.contains("data_parallel_shard_degree")) {
    id.data_parallel_shard_degree = field<int64_t>(j, "data_parallel_shard_degree", where);
  }
  id.dtype = field<std::string>(j, "dtype", where);
  id.model = field<nlohmann::json>(j, "model", where);
  if (!id.model.is_object()) throw std::runtime_error(where + ": field 'model' is not an object");
  if (j.contains("data")) {
    id.data = j["data"];
    if (!id.data.is_object()) throw std::runtime_error(where + ": field 'data' is not an object");
  }
  const auto hash = field<std::string>(j, "config_hash", where);
  if (hash != id.config_hash()) {
    throw std::runtime_error(where + ": config_hash " + hash + " does not match its model and dtype fields (" +
                             id.config_hash() + "): the metadata was edited or damaged");
  }
  return id;
}

std::vector<std::string> resume_mismatches(const CheckpointIdentity& saved, const CheckpointIdentity& job) {
  std::vector<std::string> out;
  auto differ = [&out](const std::string& key, const std::string& a, const std::string& b) {
    if (a != b) out.push_back(key + ": checkpoint " + a + ", this job " + b);
  };
  differ("parallelism.tensor_parallel_degree", std::to_string(saved.tensor_parallel_degree),
         std::to_string(job.tensor_parallel_degree));
  differ("data parallel degree", std::to_string(saved.data_parallel_degree), std::to_string(job.data_parallel_degree));
  differ("parallelism.data_parallel_shard_degree", std::to_string(saved.data_parallel_shard_degree),
         std::to_string(job.data_parallel_shard_degree));
  differ("world size (ranks)", std::to_string(saved.world_size), std::to_string(job.world_size));
  const auto model = model_mismatches(saved, job);
  out.insert(out.end(), model.begin(), model.end());
  return out;
}

namespace {

// The sizes an older hp-train did not record, as they were: its models built from [model] had
// no grouped-query attention, heads of dim / n_heads and an untied head. Where it recorded a
// config.json (hf_config, compared whole), that file said them: the job's values stand.
nlohmann::json with_sizes_older_versions_implied(nlohmann::json saved, const nlohmann::json& job) {
  const bool from_config = saved.contains("hf_config");
  auto imply = [&](const char* key, const nlohmann::json& value) {
    if (!saved.contains(key) && job.contains(key)) saved[key] = from_config ? job.at(key) : value;
  };
  if (saved.contains("n_heads") && saved.contains("dim")) {
    const int64_t heads = saved.at("n_heads").get<int64_t>(), dim = saved.at("dim").get<int64_t>();
    imply("n_kv_heads", heads);
    imply("head_dim", heads > 0 ? dim / heads : 0);
  }
  imply("tie_word_embeddings", false);
  return saved;
}

}  // namespace

std::vector<std::string> model_mismatches(const CheckpointIdentity& saved, const CheckpointIdentity& job) {
  std::vector<std::string> out;
  const nlohmann::json saved_model = with_sizes_older_versions_implied(saved.model, job.model);
  auto differ = [&out](const std::string& key, const std::string& a, const std::string& b) {
    if (a != b) out.push_back(key + ": checkpoint " + a + ", this job " + b);
  };
  differ("training.dtype", saved.dtype, job.dtype);
  for (const auto& [key, value] : job.model.items()) {
    const auto it = saved_model.find(key);
    differ("model." + key, it == saved_model.end() ? "(absent)" : it->dump(), value.dump());
  }
  for (const auto& [key, value] : saved_model.items()) {
    if (!job.model.contains(key)) differ("model." + key, value.dump(), "(absent)");
  }
  return out;
}

std::string rank_file_name(int64_t rank) { return "rank-" + std::to_string(rank) + ".pt"; }

std::string rank_file_metadata(const CheckpointIdentity& id, int64_t rank, const nlohmann::json& extra) {
  nlohmann::json meta = to_json(id);
  meta["rank"] = rank;
  if (extra.is_object()) {
    for (const auto& [key, value] : extra.items()) meta[key] = value;
  }
  return meta.dump();
}

StepManifest verify_step_files(const std::string& dir, const CheckpointIdentity& expected) {
  StepManifest manifest;
  manifest.identity = expected;
  for (int64_t rank = 0; rank < expected.world_size; ++rank) {
    const std::string path = compat::join_path(dir, rank_file_name(rank));
    const TensorFile file = read_tensor_file(path);
    int64_t file_rank = -1;
    const CheckpointIdentity id = rank_file_identity(file.metadata_json, path, &file_rank);
    const std::string problem = identity_problem(id, file_rank, expected, rank);
    if (!problem.empty()) throw std::runtime_error("checkpoint file '" + path + "' does not verify: " + problem);
    manifest.files.push_back({rank_file_name(rank), rank, checksum_file(path)});
  }
  return manifest;
}

void write_manifest(const std::string& dir, const StepManifest& manifest, int64_t rank) {
  nlohmann::json j = to_json(manifest.identity);
  j["format"] = kManifestFormat;
  j["files"] = nlohmann::json::array();
  for (const auto& f : manifest.files) {
    j["files"].push_back({{"file", f.file},
                          {"rank", f.rank},
                          {"bytes", f.checksum.bytes},
                          {"crc32c", io::crc32c_hex(f.checksum.crc32c)}});
  }
  if (manifest.tensors) j["tensors"] = to_json(*manifest.tensors);
  write_checkpoint_file(compat::join_path(dir, kManifestName), j.dump(1) + "\n", "manifest", rank);
}

StepManifest read_manifest(const std::string& dir) {
  const std::string path = compat::join_path(dir, kManifestName);
  if (!compat::path_exists(path)) {
    throw std::runtime_error("checkpoint manifest '" + path +
                             "' does not exist: the save of this step did not complete (or an older hp-train "
                             "without manifests wrote it), so its files cannot be trusted");
  }
  const nlohmann::json j = nlohmann::json::parse(io::read_whole_file(path), nullptr, /*allow_exceptions=*/false);
  const std::string where = "checkpoint manifest '" + path + "'";
  if (j.is_discarded() || !j.is_object()) throw std::runtime_error(where + " is not a JSON object");
  if (field<std::string>(j, "format", where) != kManifestFormat) {
    throw std::runtime_error(where + ": unknown format '" + j.at("format").get<std::string>() + "' (expected " +
                             kManifestFormat + ")");
  }
  StepManifest m;
  m.identity = identity_from_json(j, where);
  const auto files = field<nlohmann::json>(j, "files", where);
  if (!files.is_array() || static_cast<int64_t>(files.size()) != m.identity.world_size) {
    throw std::runtime_error(where + ": expected a 'files' array with one entry per rank (" +
                             std::to_string(m.identity.world_size) + ")");
  }
  for (const auto& f : files) {
    ManifestEntry e;
    e.file = field<std::string>(f, "file", where);
    e.rank = field<int64_t>(f, "rank", where);
    e.checksum.bytes = field<int64_t>(f, "bytes", where);
    e.checksum.crc32c = parse_crc(field<std::string>(f, "crc32c", where), where);
    if (e.rank != static_cast<int64_t>(m.files.size()) || e.file != rank_file_name(e.rank)) {
      throw std::runtime_error(where + ": entry " + std::to_string(m.files.size()) + " is '" + e.file + "' (rank " +
                               std::to_string(e.rank) + "), expected " +
                               rank_file_name(static_cast<int64_t>(m.files.size())));
    }
    m.files.push_back(e);
  }
  if (j.contains("tensors")) m.tensors = layout_table_from_json(j.at("tensors"), where);
  return m;
}

StepManifest read_step_manifest(const std::string& dir, int64_t step) {
  StepManifest manifest = read_manifest(dir);
  if (manifest.identity.step != step) {
    throw std::runtime_error("checkpoint manifest '" + compat::join_path(dir, kManifestName) + "' is for step " +
                             std::to_string(manifest.identity.step) + ", but it is in the folder of step " +
                             std::to_string(step));
  }
  return manifest;
}

TensorFile read_verified_rank_file(const std::string& dir, const StepManifest& manifest, int64_t rank) {
  const std::string path = compat::join_path(dir, rank_file_name(rank));
  if (rank < 0 || rank >= static_cast<int64_t>(manifest.files.size())) {
    throw std::runtime_error("checkpoint '" + dir + "' has " + std::to_string(manifest.files.size()) +
                             " rank files; there is no rank " + std::to_string(rank) + " to read");
  }
  // The whole file against the manifest before any of it is parsed: LibTorch's archive
  // reader trusts what a file claims (fuzz_checkpoint_reader found tensors that overrun
  // their buffer, and pickled lengths of 4 GB reserved before reading), so only the exact
  // bytes that were saved reach it.
  const FileChecksum actual = checksum_file(path);
  const auto same = [&](const FileChecksum& c) { return c.bytes == actual.bytes && c.crc32c == actual.crc32c; };
  const FileChecksum& recorded = manifest.files.at(static_cast<size_t>(rank)).checksum;
  if (!same(recorded)) {
    std::string whose =
        "it matches none of the files this step's manifest records (changed after the save, or "
        "copied from another step or run)";
    for (const auto& f : manifest.files) {
      if (f.rank != rank && same(f.checksum)) {
        whose = "it holds rank " + std::to_string(f.rank) + "'s state (its bytes are those the manifest records for " +
                f.file + "): the rank files were swapped or copied";
      }
    }
    throw std::runtime_error("checkpoint file '" + path + "' does not verify: " + std::to_string(actual.bytes) +
                             " bytes with CRC-32C " + io::crc32c_hex(actual.crc32c) + ", the manifest recorded " +
                             std::to_string(recorded.bytes) + " bytes with " + io::crc32c_hex(recorded.crc32c) + "; " +
                             whose);
  }
  const TensorFile file = read_tensor_file(path);
  // The bytes are the saved ones; their identity must still be this job's step and rank
  // (a whole step folder, manifest included, copied from another run).
  int64_t file_rank = -1;
  const CheckpointIdentity id = rank_file_identity(file.metadata_json, path, &file_rank);
  const std::string problem = identity_problem(id, file_rank, manifest.identity, rank);
  if (!problem.empty()) throw std::runtime_error("checkpoint file '" + path + "' does not verify: " + problem);
  return file;
}

}  // namespace hyper_parallel::train
