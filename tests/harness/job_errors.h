// The pattern of the tests that expect a job or a call to be refused: every rank-thread runs a
// body (or one call runs), each rank's error is kept, and the test checks that every rank
// failed and what the errors say together.
#pragma once

#include <gtest/gtest.h>

#include <c10/util/Exception.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "compat/file_system.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/core/device_mesh.h"

namespace hyper_parallel::testing {

// A c10::Error without its backtrace; any other exception's what().
inline std::string error_text(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

// fn(rank) on `ranks` rank-threads; each rank's error ("" if none).
inline std::vector<std::string> rank_errors(int64_t ranks, const std::function<void(int64_t)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  run_ranks(ranks, [&](int64_t rank) {
    try {
      fn(rank);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(rank)] = error_text(e);
    }
  });
  return errors;
}

// call(rank, mesh) on `ranks` rank-threads, each with a 1-D CPU mesh of them: each rank's
// error of type E (error_text), "other error: " and the text for any other exception, "no error"
// when it raised none. Bounded: a hang fails in 10 s.
template <class E = std::exception>
std::vector<std::string> mesh_rank_errors(int64_t ranks, const std::function<void(int64_t, const DeviceMesh&)>& call) {
  std::vector<std::string> got(static_cast<size_t>(ranks));
  run_ranks(
      ranks,
      [&](int64_t rank) {
        auto mesh = init_device_mesh("cpu", {ranks});
        std::string& mine = got[static_cast<size_t>(rank)];
        try {
          call(rank, mesh);
          mine = "no error";
        } catch (const std::exception& e) {
          if constexpr (std::is_same_v<E, std::exception>) {
            mine = error_text(e);
          } else {
            mine = dynamic_cast<const E*>(&e) ? error_text(e) : "other error: " + error_text(e);
          }
        }
      },
      std::chrono::seconds(10));
  return got;
}

// fn()'s error if it raised an E (its what()), "<no error>" when it raised nothing; any other
// exception goes through.
template <class E>
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "<no error>";
}

// Every rank failed, and at least one error holds each of `needles`.
inline void expect_refused(const std::vector<std::string>& errors, const std::vector<std::string>& needles) {
  std::string all;
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_FALSE(errors[r].empty()) << "rank " << r << " went on without an error";
    all += "[rank " + std::to_string(r) + "] " + errors[r] + "\n";
  }
  for (const auto& n : needles) EXPECT_NE(all.find(n), std::string::npos) << "expected '" << n << "' in:\n" << all;
}

// A folder under $TMPDIR that does not exist yet, unique to this process and call.
inline std::string fresh_test_dir(const std::string& prefix, const std::string& name) {
  static int counter = 0;
  const std::string dir = compat::join_path(
      compat::temp_directory(), prefix + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  compat::remove_all(dir);
  return dir;
}

}  // namespace hyper_parallel::testing
