// A transformers config.json for the families' readers (from_hf_config): its text, parsed,
// and its fields read with errors that name the file, the field and its value.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace hyper_parallel {

inline std::string read_hf_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the model config " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The config as a JSON object; anything else is an error naming `source`.
inline nlohmann::json parse_hf_config_json(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(source + ": expected a JSON object (a transformers config)");
  return j;
}

// Reads a transformers config, naming the file and field in every error.
class HfConfigReader {
 public:
  using json = nlohmann::json;
  HfConfigReader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw std::runtime_error(source_ + ": " + field + " " + what);
  }
  [[noreturn]] void refuse(const std::string& field, const json& value, const std::string& why) const {
    fail(field, "= " + value.dump() + ": " + why);
  }
  bool has(const json& in, const char* key) const { return in.contains(key) && !in.at(key).is_null(); }

  template <class T>
  T get(const json& in, const std::string& prefix, const char* key, std::optional<T> fallback = std::nullopt) const {
    if (!has(in, key)) {
      if (fallback) return *fallback;
      fail(prefix + key, "is missing");
    }
    const json& v = in.at(key);
    if constexpr (std::is_same_v<T, int64_t>) {
      if (!v.is_number_integer()) refuse(prefix + key, v, "expected an integer");
    } else if constexpr (std::is_same_v<T, double>) {
      if (!v.is_number()) refuse(prefix + key, v, "expected a number");
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) refuse(prefix + key, v, "expected true or false");
    } else {
      if (!v.is_string()) refuse(prefix + key, v, "expected a string");
    }
    return v.get<T>();
  }
  template <class T>
  T get(const char* key, std::optional<T> fallback = std::nullopt) const {
    return get<T>(j_, "", key, fallback);
  }

  const json& j_;
  std::string source_;
};

}  // namespace hyper_parallel
