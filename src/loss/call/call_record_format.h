// The call record's wire format (internal to the call agreement, call_agreement.h): a
// LossCallRecord as kRecordSize float64 slots, the fields the ranks compare, and how a field
// reads in the error that names the ranks. call_agreement.cpp sends and compares records in
// this format; nothing else needs the slots.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loss/call/call_agreement.h"

namespace hyper_parallel {
namespace call_record_format {

// A shape in the record: its rank, its first kMaxDims dims, and a 32-bit hash of all of them
// (for longer shapes; -1 stands for a dim recorded as free, the class dim).
inline constexpr int64_t kMaxDims = 6;
inline constexpr int64_t kShapeSlots = 2 + kMaxDims;

// The record's slots. Integers are exact in float64 up to 2^53; hashes travel as 32-bit
// pieces for that reason.
enum Slot : int64_t {
  // What decides which collectives the call makes (a refusal's message exchange included),
  // known to every rank whatever its inputs: compared before the ranks' refusals are settled.
  kOpHash,
  kInContext,
  kStrict,
  kVocabKnown,
  // The rest, compared once no rank refused its inputs.
  kRows,
  kDtype,
  kVocab,
  kClassDim,
  kLogitsShape,
  kTargetKind = kLogitsShape + kShapeSlots,
  kTargetShape,
  kHiddenDim = kTargetShape + kShapeSlots,
  kReduction,
  kIgnoreIndex,
  kLabelSmoothing,
  kZLoss,
  kSoftcap,
  kGradientInForward,
  kTemperature,
  kEntropy,
  kWeightHash,                      // two slots
  kLocalClasses = kWeightHash + 2,  // not compared: the pieces may differ
  kRecordSize
};
inline constexpr int64_t kStructuralSlots = kRows;  // kOpHash .. kVocabKnown

enum class Format { number, integer, op, dtype, reduction, boolean, hash, shape, target_kind, context, strict, vocab };

// A compared field: its slots, what the error calls it, how its value reads.
struct Field {
  int64_t slot;
  int64_t width;
  const char* what;
  Format format;
};
inline constexpr Field kStructural[] = {
    {kOpHash, 1, "loss op", Format::op},
    {kInContext, 1, "loss_parallel context", Format::context},
    {kStrict, 1, "loss_parallel strictness", Format::strict},
    {kVocabKnown, 1, "vocabulary's source", Format::vocab},
};
inline constexpr Field kCompared[] = {
    {kRows, 1, "row count (the logits' elements over the class dim)", Format::integer},
    {kDtype, 1, "dtype", Format::dtype},
    {kVocab, 1, "vocabulary size (the global class count this rank assumes)", Format::integer},
    {kClassDim, 1, "class dim", Format::integer},
    {kLogitsShape, kShapeSlots, "logits' shape (* the class dim)", Format::shape},
    {kTargetKind, 1, "target kind", Format::target_kind},
    {kTargetShape, kShapeSlots, "target's shape (* a probability target's class dim)", Format::shape},
    {kHiddenDim, 1, "hidden size (the hidden states' last dim)", Format::integer},
    {kReduction, 1, "reduction", Format::reduction},
    {kIgnoreIndex, 1, "ignore_index", Format::integer},
    {kLabelSmoothing, 1, "label_smoothing", Format::number},
    {kZLoss, 1, "z_loss_weight", Format::number},
    {kSoftcap, 1, "logit_softcap", Format::number},
    {kGradientInForward, 1, "gradient_in_forward", Format::boolean},
    {kTemperature, 1, "temperature", Format::number},
    {kEntropy, 1, "return_entropy", Format::boolean},
    {kWeightHash, 2, "class weight", Format::hash},
};

// `mine` as the record's float64 slots (kRecordSize of them).
std::vector<double> record_values(const LossCallRecord& mine);

// Field `f`'s value `v` (its first slot) as the error shows it.
std::string readable(const Field& f, const double* v);

// Throws the same LossParallelLayoutError on every rank when `f` differs between the `n`
// records of `width` slots in `r` (every rank holds all of them, so all build the same words).
void compare_field(const Field& f, const double* r, int64_t n, int64_t width, const std::string& op);

}  // namespace call_record_format
}  // namespace hyper_parallel
