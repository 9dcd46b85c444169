// rank_error_file.h — how a rank tells hp-run why it gave up, so that hp-run can name the
// rank that failed first (torchrun's error files). hp-run gives each rank a path in
// HP_ERROR_FILE; a rank's last catch writes its error and the time there. When several
// ranks fail (the others usually because the first one left), the earliest error is the
// cause: the first rank to exit may well be a peer that died of the disconnect while the
// failing rank was still tearing down.
//
// Header-only and LibTorch-free: libhyper_parallel writes the files (record_fatal_error,
// fatal_error.h), hp-run reads them; a public header so that both include it from below
// (the launcher includes nothing else of the library). A launcher of your own can read them.
// hp-run removes its folder at the end; only an hp-run killed by SIGKILL leaves it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel::launcher {

constexpr const char* kErrorFileVariable = "HP_ERROR_FILE";
constexpr const char* kErrorFileHeader = "hp-rank-error v1";
// The optional line before the message of a rank that gave up only because another rank
// failed (its message names that rank): hp-run then prefers the failing rank's own error,
// even one recorded a little later (ranks that agree on a failure all throw at once).
constexpr const char* kPeerCauseLine = "cause: peer\n";

struct RankError {
  int64_t unix_time_ns = 0;
  std::string message;
  bool caused_by_peer = false;
};

inline int64_t unix_time_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Writes "header\n<ns>\n[cause: peer\n]<message>" to a temporary file renamed onto
// `path`, so a rank killed while writing leaves no half file. Returns false when it cannot
// (the error is still printed by the caller; hp-run then names the first rank to exit).
inline bool write_rank_error_file(const std::string& path, const std::string& message, bool caused_by_peer = false) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kErrorFileHeader << "\n" << unix_time_ns() << "\n" << (caused_by_peer ? kPeerCauseLine : "") << message;
    if (!out.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// The error at `path`; nullopt when there is none or it is not one of ours.
inline std::optional<RankError> read_rank_error_file(const std::string& path) {
  std::ifstream in(path);
  std::string header, time;
  if (!std::getline(in, header) || header != kErrorFileHeader || !std::getline(in, time)) return std::nullopt;
  RankError e;
  try {
    size_t used = 0;
    e.unix_time_ns = std::stoll(time, &used);
    if (used != time.size()) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::ostringstream rest;
  rest << in.rdbuf();
  e.message = rest.str();
  const std::string peer = kPeerCauseLine;
  if (e.message.rfind(peer, 0) == 0) {
    e.caused_by_peer = true;
    e.message.erase(0, peer.size());
  }
  return e;
}

}  // namespace hyper_parallel::launcher

HP_PUBLIC_END
