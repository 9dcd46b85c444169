// kernel_inputs.h: the C interface's checks and the kernels' arrays.
#include "kernels_c/kernel_inputs.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <limits>
#include <string>

#include "kernels_c/kernel_error.h"

namespace hyper_parallel::kernels_c {

namespace {

std::string dtype_name(int32_t dtype) {
  switch (dtype) {
    case HPK_FLOAT32:
      return "HPK_FLOAT32";
    case HPK_FLOAT16:
      return "HPK_FLOAT16";
    case HPK_BFLOAT16:
      return "HPK_BFLOAT16";
    case HPK_FLOAT64:
      return "HPK_FLOAT64";
    case HPK_INT32:
      return "HPK_INT32";
    case HPK_INT64:
      return "HPK_INT64";
    default:
      return "an unknown dtype (" + std::to_string(dtype) + ")";
  }
}

bool is_floating(int32_t dtype) { return dtype >= HPK_FLOAT32 && dtype <= HPK_FLOAT64; }
bool is_index(int32_t dtype) { return dtype == HPK_INT32 || dtype == HPK_INT64; }

constexpr const char* kFloatingDtypes = "HPK_FLOAT32, HPK_FLOAT16, HPK_BFLOAT16 or HPK_FLOAT64";

// Element i of an array of `dtype` (checked before) as T.
template <typename T>
T element(const void* data, int32_t dtype, int64_t i) {
  switch (dtype) {
    case HPK_FLOAT32:
      return static_cast<T>(static_cast<const float*>(data)[i]);
    case HPK_FLOAT16:
      return static_cast<T>(static_cast<float>(static_cast<const c10::Half*>(data)[i]));
    case HPK_BFLOAT16:
      return static_cast<T>(static_cast<float>(static_cast<const c10::BFloat16*>(data)[i]));
    case HPK_FLOAT64:
      return static_cast<T>(static_cast<const double*>(data)[i]);
    case HPK_INT32:
      return static_cast<T>(static_cast<const int32_t*>(data)[i]);
    default:
      return static_cast<T>(static_cast<const int64_t*>(data)[i]);
  }
}

void check_finite_at_least(double value, double low, const char* name, const char* why) {
  if (!(std::isfinite(value) && value >= low)) fail(HPK_ERROR_OPTION, "expected ", name, " ", why, ", got ", value);
}

// The index targets' values: each in [0, C) or ignore_index; returns them as global ids.
std::vector<int64_t> index_targets(int32_t dtype, const void* target, int64_t rows, int64_t classes,
                                   int64_t ignore_index) {
  std::vector<int64_t> ids(static_cast<size_t>(rows));
  if (rows > 0) require(target, "target");
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = element<int64_t>(target, dtype, r);
    if (t != ignore_index && (t < 0 || t >= classes))
      fail(HPK_ERROR_TARGET, "expected index targets in [0, ", classes, ") (total_classes) or equal to ignore_index (",
           ignore_index, "), got ", t, " at row ", r);
    ids[static_cast<size_t>(r)] = t;
  }
  return ids;
}

}  // namespace

c10::ScalarType scalar_type_of(int32_t dtype) {
  switch (dtype) {
    case HPK_FLOAT16:
      return c10::ScalarType::Half;
    case HPK_BFLOAT16:
      return c10::ScalarType::BFloat16;
    case HPK_FLOAT64:
      return c10::ScalarType::Double;
    default:
      return c10::ScalarType::Float;
  }
}

void require(const void* pointer, const char* name) {
  if (!pointer) fail(HPK_ERROR_NULL_POINTER, "expected ", name, " to point at data, got NULL");
}

int64_t row_stride_of(int64_t stride, int64_t rows, int64_t cols, const char* name) {
  if (stride == 0) return cols;
  if (stride < cols && rows > 1)
    fail(HPK_ERROR_SHAPE, "expected ", name, " 0 or >= ", cols, " (the classes of a row), got ", stride);
  if (stride < 0) fail(HPK_ERROR_SHAPE, "expected ", name, " >= 0, got ", stride);
  return stride;
}

void check_logits(const hpk_logits& x, bool reads_data) {
  if (!is_floating(x.dtype))
    fail(HPK_ERROR_DTYPE, "expected logits.dtype ", kFloatingDtypes, ", got ", dtype_name(x.dtype));
  if (x.rows < 0) fail(HPK_ERROR_SHAPE, "expected logits.rows >= 0, got ", x.rows);
  if (x.local_classes < 0) fail(HPK_ERROR_SHAPE, "expected logits.local_classes >= 0, got ", x.local_classes);
  if (x.class_offset < 0) fail(HPK_ERROR_SHAPE, "expected logits.class_offset >= 0, got ", x.class_offset);
  if (x.total_classes < 1) fail(HPK_ERROR_SHAPE, "expected logits.total_classes >= 1, got ", x.total_classes);
  if (x.class_offset > x.total_classes - x.local_classes)
    fail(HPK_ERROR_SHAPE, "expected this rank's classes inside the total: class_offset (", x.class_offset,
         ") + local_classes (", x.local_classes, ") <= total_classes (", x.total_classes, ")");
  row_stride_of(x.row_stride, x.rows, x.local_classes, "logits.row_stride");
  if (reads_data && x.rows > 0 && x.local_classes > 0) require(x.data, "logits.data");
}

void check_cross_entropy(const hpk_cross_entropy& ce, bool reads_logits) {
  check_logits(ce.logits, reads_logits);
  if (ce.reduction != HPK_REDUCTION_NONE && ce.reduction != HPK_REDUCTION_MEAN && ce.reduction != HPK_REDUCTION_SUM)
    fail(HPK_ERROR_OPTION,
         "expected reduction HPK_REDUCTION_NONE (0), HPK_REDUCTION_MEAN (1) or HPK_REDUCTION_SUM (2), got ",
         ce.reduction);
  if (!(ce.label_smoothing >= 0 && ce.label_smoothing <= 1))
    fail(HPK_ERROR_OPTION, "expected label_smoothing in [0, 1], got ", ce.label_smoothing);
  check_finite_at_least(ce.z_loss_weight, 0, "z_loss_weight", "finite and >= 0");
  check_finite_at_least(ce.logit_softcap, 0, "logit_softcap", "finite and >= 0 (0: off)");
  if (ce.target_kind == HPK_TARGET_INDEX) {
    if (!is_index(ce.target_dtype))
      fail(HPK_ERROR_DTYPE, "expected index targets of HPK_INT32 or HPK_INT64, got ", dtype_name(ce.target_dtype));
  } else if (ce.target_kind == HPK_TARGET_PROBABILITIES) {
    if (!is_floating(ce.target_dtype))
      fail(HPK_ERROR_DTYPE, "expected probability targets of ", kFloatingDtypes, ", got ", dtype_name(ce.target_dtype));
    row_stride_of(ce.target_row_stride, ce.logits.rows, ce.logits.local_classes, "target_row_stride");
    if (ce.ignore_index >= 0)
      fail(HPK_ERROR_OPTION,
           "probability targets take no ignore_index: expected a negative ignore_index (PyTorch's rule), got ",
           ce.ignore_index);
  } else {
    fail(HPK_ERROR_OPTION, "expected target_kind HPK_TARGET_INDEX (0) or HPK_TARGET_PROBABILITIES (1), got ",
         ce.target_kind);
  }
  if (ce.weight) {
    if (!is_floating(ce.weight_dtype))
      fail(HPK_ERROR_DTYPE, "expected class weights of ", kFloatingDtypes, ", got ", dtype_name(ce.weight_dtype));
    if (ce.weight_length != ce.logits.total_classes)
      fail(HPK_ERROR_WEIGHT, "expected class weights of length total_classes (", ce.logits.total_classes,
           "), got weight_length ", ce.weight_length);
  }
}

void check_logprobs(const hpk_logprobs& lp, bool reads_logits) {
  check_logits(lp.logits, reads_logits);
  if (!is_index(lp.target_dtype))
    fail(HPK_ERROR_DTYPE, "expected targets (sampled tokens) of HPK_INT32 or HPK_INT64, got ",
         dtype_name(lp.target_dtype));
  check_finite_at_least(lp.temperature, 0, "temperature", "finite and > 0");
  // The kernels scale by 1 / T in the compute type: it must be finite there.
  const double inv_t = 1.0 / lp.temperature;
  const bool in_double = lp.logits.dtype == HPK_FLOAT64;
  if (lp.temperature == 0 || !(in_double ? std::isfinite(inv_t) : std::isfinite(static_cast<float>(inv_t))))
    fail(HPK_ERROR_OPTION, "expected temperature > 0 with 1 / temperature finite in the compute type (",
         in_double ? "float64" : "float32", "), got ", lp.temperature);
}

template <typename acc_t>
CrossEntropyInputs<acc_t> prepare_cross_entropy(const hpk_cross_entropy& ce, bool with_probabilities) {
  const hpk_logits& x = ce.logits;
  const int64_t rows = x.rows, local = x.local_classes, classes = x.total_classes;
  CrossEntropyInputs<acc_t> in;
  std::vector<acc_t> weight;
  if (ce.weight) {
    weight.resize(static_cast<size_t>(classes));
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) {
      weight[static_cast<size_t>(c)] = element<acc_t>(ce.weight, ce.weight_dtype, c);
      sum += static_cast<double>(weight[static_cast<size_t>(c)]);
    }
    in.weight_sum = sum;
    in.local_weight.assign(weight.begin() + x.class_offset, weight.begin() + x.class_offset + local);
  } else {
    in.weight_sum = static_cast<double>(classes);
  }
  if (ce.target_kind == HPK_TARGET_INDEX) {
    const std::vector<int64_t> ids = index_targets(ce.target_dtype, ce.target, rows, classes, ce.ignore_index);
    in.target_col.resize(static_cast<size_t>(rows));
    in.valid.resize(static_cast<size_t>(rows));
    in.row_weight.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = ids[static_cast<size_t>(r)];
      const bool counted = t != ce.ignore_index;
      const bool owned = counted && t >= x.class_offset && t < x.class_offset + local;
      in.target_col[static_cast<size_t>(r)] = owned ? t - x.class_offset : -1;
      in.valid[static_cast<size_t>(r)] = counted ? 1 : 0;
      in.row_weight[static_cast<size_t>(r)] = !counted    ? acc_t(0)
                                              : ce.weight ? weight[static_cast<size_t>(t)]
                                                          : acc_t(1);
    }
  } else if (with_probabilities && rows > 0 && local > 0) {
    require(ce.target, "target");
    const int64_t ld = row_stride_of(ce.target_row_stride, rows, local, "target_row_stride");
    const int32_t own_type = sizeof(acc_t) == sizeof(double) ? HPK_FLOAT64 : HPK_FLOAT32;
    if (ce.target_dtype == own_type) {
      in.q = static_cast<const acc_t*>(ce.target);
      in.ldq = ld;
    } else {
      in.q_storage.resize(static_cast<size_t>(rows * local));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < local; ++c)
          in.q_storage[static_cast<size_t>(r * local + c)] = element<acc_t>(ce.target, ce.target_dtype, r * ld + c);
      in.q = in.q_storage.data();
      in.ldq = local;
    }
  }
  return in;
}

template CrossEntropyInputs<float> prepare_cross_entropy<float>(const hpk_cross_entropy&, bool);
template CrossEntropyInputs<double> prepare_cross_entropy<double>(const hpk_cross_entropy&, bool);

LogprobsInputs prepare_logprobs(const hpk_logprobs& lp) {
  const hpk_logits& x = lp.logits;
  const std::vector<int64_t> ids = index_targets(lp.target_dtype, lp.target, x.rows, x.total_classes, lp.ignore_index);
  LogprobsInputs in;
  in.target_col.resize(ids.size());
  in.valid.resize(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    const int64_t t = ids[r];
    const bool counted = t != lp.ignore_index;
    in.valid[r] = counted ? 1 : 0;
    in.target_col[r] = counted && t >= x.class_offset && t < x.class_offset + x.local_classes ? t - x.class_offset : -1;
  }
  return in;
}

}  // namespace hyper_parallel::kernels_c
