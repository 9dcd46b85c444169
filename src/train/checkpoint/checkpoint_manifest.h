// checkpoint_manifest.h — what a step of hp-train's checkpoints proves about itself.
//
// A step folder holds one file per rank and, written last, manifest.json:
//   step-<N>/rank-<R>.pt      write_tensor_file; its metadata JSON carries the
//                             CheckpointIdentity below plus "rank"
//   step-<N>/manifest.json    the identity, then every rank file's size and CRC-32C
// Save protocol (Trainer::save_checkpoint): every rank writes its file; all ranks
// agree that all succeeded; rank 0 re-reads every file (verify_step_files: identity,
// rank, step, tensor checksums), writes the manifest, then `latest`. So `latest`
// only ever names a step whose manifest and files verified, and a crash anywhere
// leaves `latest` on the previous such step.
// Loading (read_step_manifest, then CheckpointManager's checks against the job) checks
// the manifest, then each rank file against it (read_verified_rank_file), and names the file and the field that differ.
// A resume at another layout reads the files it needs (checkpoint_reshard.h) each through read_verified_rank_file,
// against the manifest's table of tensor layouts.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hyper_parallel_train/checkpoint/checkpoint_identity.h"
#include "train/checkpoint/checkpoint_io.h"
#include "train/checkpoint/checkpoint_layout.h"

namespace hyper_parallel::train {

nlohmann::json to_json(const CheckpointIdentity& id);
// Throws std::runtime_error naming `where` and the missing or mistyped field.
CheckpointIdentity identity_from_json(const nlohmann::json& j, const std::string& where);

// Every field in which a checkpoint (`saved`) differs from the job resuming it, each
// as "<key>: checkpoint <a>, this job <b>" with the job config key (model.dim,
// training.dtype, parallelism.tensor_parallel_degree ...). Run id and step aside.
std::vector<std::string> resume_mismatches(const CheckpointIdentity& saved, const CheckpointIdentity& job);
// The same for the fields that make a different model (dtype, [model]): those a resume
// cannot bridge, while a different layout (TP, DP, world) it can reshard.
std::vector<std::string> model_mismatches(const CheckpointIdentity& saved, const CheckpointIdentity& job);

struct ManifestEntry {
  std::string file;  // name inside the step folder
  int64_t rank = 0;
  FileChecksum checksum;
};

struct StepManifest {
  CheckpointIdentity identity;
  std::vector<ManifestEntry> files;  // by rank
  // Every tensor's global shape, dtype and placement ("tensors"); absent in checkpoints
  // of an hp-train before resharding, which resume only at their own layout.
  std::optional<LayoutTable> tensors;
};

constexpr const char* kManifestName = "manifest.json";
std::string rank_file_name(int64_t rank);  // "rank-<rank>.pt"

// The metadata JSON a rank file carries: the identity plus its rank.
std::string rank_file_metadata(const CheckpointIdentity& id, int64_t rank, const nlohmann::json& extra = {});

// Rank 0 after every rank's file is complete: reads each rank file of `dir`
// (tensor checksums), checks that it belongs to `expected` (run id, step, layout,
// model) and to its rank, and returns the manifest to write. Throws
// std::runtime_error naming the file and the mismatch.
StepManifest verify_step_files(const std::string& dir, const CheckpointIdentity& expected);

void write_manifest(const std::string& dir, const StepManifest& manifest, int64_t rank);
// Throws std::runtime_error naming the file when it is missing (the save did not
// finish, or an older hp-train wrote it), unreadable or malformed.
StepManifest read_manifest(const std::string& dir);

// read_manifest of the folder of `step`, refused (std::runtime_error naming the manifest)
// when it names another step.
StepManifest read_step_manifest(const std::string& dir, int64_t step);

// The file of `rank` in `dir`, checked against `manifest` (already checked against the
// job): size and CRC-32C before any of it is parsed, then its tensors' checksums and its
// identity (run id, step, rank, layout). Throws std::runtime_error naming the file.
TensorFile read_verified_rank_file(const std::string& dir, const StepManifest& manifest, int64_t rank);

}  // namespace hyper_parallel::train
