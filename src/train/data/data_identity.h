// data_identity.h — what defines the batches a job trains on, recorded in its checkpoints.
//
// The weights of a checkpoint only mean something with the data they were trained on: a
// text corpus's word -> id table is rebuilt from the file at every start (so another file
// gives every embedding row another word), and the synthetic corpus's language and every
// batch's rows come from the seed. A resume whose data differs is therefore refused,
// naming the field, unless checkpoint.allow_data_change says the change is intended
// (fine-tuning old weights on new data is legitimate).
//
// Recorded: the corpus ("synthetic" or the text file's absolute path), its size and
// CRC-32C (the token ids are a function of these bytes and model.vocab_size, which the
// model identity holds), the tokenizer, training.seed, training.batch_size (global) and
// training.seq_len.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "train/data/corpus_identity.h"
#include "hyper_parallel_train/config/job_config.h"

namespace hyper_parallel::train {

// The record of `training`'s data, as a JSON object (the checkpoint identity's "data").
// A pre-tokenized corpus is recorded by its CorpusIdentity (format, files with size and
// CRC-32C, tokenizer, separators); a text file is read once for its checksum;
// std::runtime_error naming it when it cannot be read.
nlohmann::json data_identity(const TrainingConfig& training, const std::optional<CorpusIdentity>& tokens);

// Every field in which a checkpoint's data record differs from the job's, each as
// "<key>: checkpoint <a>, this job <b>" with the job config key (training.seed ...).
// Paths are not compared: a corpus moved or copied elsewhere is the same data.
std::vector<std::string> data_mismatches(const nlohmann::json& saved, const nlohmann::json& job);
// When the records differ only in the corpus's paths: the sentence that says from where to
// where, and that the checkpoint's data is read there.
std::optional<std::string> data_moved(const nlohmann::json& saved, const nlohmann::json& job);

}  // namespace hyper_parallel::train
