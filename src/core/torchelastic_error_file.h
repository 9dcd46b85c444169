// torchelastic_error_file.h — the error file torchrun gives each worker (TORCHELASTIC_ERROR_FILE).
#pragma once

#include <string>

namespace hyper_parallel {

constexpr const char* kTorchelasticErrorFileVariable = "TORCHELASTIC_ERROR_FILE";

// Writes `message` in the JSON torchrun's own @record writes ({"message": {"message": ...,
// "extraInfo": {"py_callstack": ..., "timestamp": "<seconds>"}}}), through a renamed temporary
// file. torchrun's summary names as "Root Cause" the failure with the smallest timestamp, in
// whole seconds, the lowest rank winning a tie: a rank that only echoes a peer's failure
// (caused_by_peer) dates its error one second later, so the failing rank's own error is named.
// Returns false when the file cannot be written.
bool write_torchelastic_error_file(const std::string& path, const std::string& message, bool caused_by_peer);

}  // namespace hyper_parallel
