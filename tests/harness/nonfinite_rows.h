// Logits rows with NaN, +inf or -inf at the places a reduction over a row can lose them
// (the first column, inside a CUDA thread's first 256 columns, past them, the last
// column, the target, twice in one thread, the whole row), and a check that compares
// results with ATen's value by value (NaN where ATen has NaN, the same infinities).
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <limits>
#include <string>
#include <vector>

#include "harness/rank_harness.h"

namespace hyper_parallel::testing {

struct NonFiniteRows {
  at::Tensor logits;               // [rows, cols] float64
  at::Tensor target;               // [rows] int64, class 5 in every row
  std::vector<std::string> names;  // what each row holds
};

inline NonFiniteRows nonfinite_rows(int64_t cols) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const int64_t t = 5, past = std::min<int64_t>(300, cols - 1), last = cols - 1;
  struct Row {
    std::string name;
    std::vector<std::pair<int64_t, double>> set;  // column, value; column -1: the whole row
  };
  const std::vector<Row> spec = {
      {"finite", {}},
      {"NaN at 0", {{0, nan}}},
      {"NaN at 100", {{100, nan}}},
      {"NaN at 255", {{255, nan}}},
      {"NaN at " + std::to_string(past), {{past, nan}}},
      {"NaN at the last column", {{last, nan}}},
      {"NaN at the target", {{t, nan}}},
      {"all NaN", {{-1, nan}}},
      {"+inf at 0", {{0, inf}}},
      {"+inf at 100", {{100, inf}}},
      {"+inf at " + std::to_string(past), {{past, inf}}},
      {"+inf at the target", {{t, inf}}},
      {"+inf at 0 and 256", {{0, inf}, {std::min<int64_t>(256, last), inf}}},
      {"all +inf", {{-1, inf}}},
      {"-inf at 0", {{0, -inf}}},
      {"-inf at 100", {{100, -inf}}},
      {"-inf at the target", {{t, -inf}}},
      {"all -inf", {{-1, -inf}}},
      {"-inf but the target", {{-1, -inf}, {t, 1.5}}},
      {"-inf but one past 256", {{-1, -inf}, {past, 1.5}}},
      {"NaN at 100, +inf at " + std::to_string(past), {{100, nan}, {past, inf}}},
      // Long rows: the CPU kernel's later blocks meet these (a block's max rescales the sum).
      {"+inf at the last column", {{last, inf}}},
      {"-inf but the last column", {{-1, -inf}, {last, 1.5}}},
      {"20 at the last column (a max raised a little)", {{last, 20}}},
      {"60 at the last column (a max raised far)", {{last, 60}}},
  };
  NonFiniteRows r;
  r.logits = random_tensor({static_cast<int64_t>(spec.size()), cols}, 77) * 3;
  r.target = at::full({static_cast<int64_t>(spec.size())}, t, at::kLong);
  for (size_t i = 0; i < spec.size(); ++i) {
    for (auto [col, v] : spec[i].set) {
      if (col < 0)
        r.logits[static_cast<int64_t>(i)].fill_(v);
      else
        r.logits[static_cast<int64_t>(i)][col] = v;
    }
    r.names.push_back(spec[i].name);
  }
  return r;
}

inline std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// got and want ([rows] or [rows, cols]) agree value by value: NaN where want has NaN, the
// same infinities, finite values within tol (relative and absolute). Names the rows that differ.
inline void expect_same_values(const at::Tensor& got_in, const at::Tensor& want_in, double tol,
                               const std::vector<std::string>& row_names, const std::string& what) {
  const at::Tensor got = got_in.detach().cpu().to(at::kDouble), want = want_in.detach().cpu().to(at::kDouble);
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor close = at::isclose(got, want, tol, tol, /*equal_nan=*/true).reshape({got.size(0), -1});
  std::vector<std::string> bad;
  for (int64_t r = 0; r < close.size(0); ++r) {
    const at::Tensor off = close[r].logical_not().nonzero();
    if (off.size(0) == 0) continue;
    const int64_t j = off[0][0].item<int64_t>();  // the first value that differs
    bad.push_back(c10::str(row_names[static_cast<size_t>(r)], " (", got.reshape({got.size(0), -1})[r][j].item<double>(),
                           " where ATen gives ", want.reshape({got.size(0), -1})[r][j].item<double>(), ")"));
  }
  EXPECT_TRUE(bad.empty()) << what << ": rows that differ from ATen: " << joined(bad);
}

}  // namespace hyper_parallel::testing
