// fatal_error.h — a rank's fatal error, for its launcher.
#pragma once

#include <stdexcept>
#include <string>
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// hp-run and torchrun give each rank an error file (HP_ERROR_FILE, TORCHELASTIC_ERROR_FILE) and,
// when ranks fail, name the one whose error came first: the first to exit is often a peer that
// died of the disconnect while the failing rank was still tearing down. Call it where the
// program gives up (the catch in main), before tearing down. It writes whichever of the two
// files the launcher named (torchrun's in its own JSON); without either it does nothing; the
// first call of a process is the one kept.
// caused_by_peer: this rank gives up only because another rank failed (a PeerFailure);
// hp-run then names that rank's own error rather than this one.
void record_fatal_error(const std::string& message, bool caused_by_peer = false);

// The error of a rank that stops because another rank failed, naming that rank (e.g. "...
// failed on rank(s) 1 (their error says why)"): the failing rank raises its own error.
class PeerFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace hyper_parallel

HP_PUBLIC_END
