// torchelastic_error_file.cpp — write_torchelastic_error_file(): a rank's error for torchrun.
#include "core/torchelastic_error_file.h"

#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

namespace hyper_parallel {

namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace

bool write_torchelastic_error_file(const std::string& path, const std::string& message, bool caused_by_peer) {
  const long long seconds = static_cast<long long>(std::time(nullptr)) + (caused_by_peer ? 1 : 0);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "{\"message\": {\"message\": " << json_string(message)
        << ", \"extraInfo\": {\"py_callstack\": " << json_string(message) << ", \"timestamp\": \"" << seconds
        << "\"}}}\n";
    if (!out.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace hyper_parallel
