// torchelastic_error_file.cpp — write_torchelastic_error_file(): a rank's error for torchrun.
#include "core/torchelastic_error_file.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

namespace hyper_parallel {

bool write_torchelastic_error_file(const std::string& path, const std::string& message, bool caused_by_peer) {
  const long long seconds = static_cast<long long>(std::time(nullptr)) + (caused_by_peer ? 1 : 0);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    const nlohmann::json record = {
        {"message",
         {{"message", message}, {"extraInfo", {{"py_callstack", message}, {"timestamp", std::to_string(seconds)}}}}}};
    // Bytes that are not UTF-8 (a path in the message) become U+FFFD: torchrun must parse the file.
    out << record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!out.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace hyper_parallel
