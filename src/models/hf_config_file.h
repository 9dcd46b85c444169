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

// A config.json's RoPE settings. transformers 5 writes rope_parameters (rope_theta
// inside); older files a top-level rope_theta and an optional rope_scaling.
struct HfRope {
  double theta = 10000.0;
  std::string type = "default";                // rope_type (or the older "type")
  std::string type_field;                      // where the type was read, for errors
  const nlohmann::json* parameters = nullptr;  // rope_parameters / rope_scaling; null: none
  std::string prefix;                          // "rope_parameters." or "rope_scaling.", for errors
  const char* key = "rope_scaling";            // which of the two it is
};

// Reads them, refusing what no family here supports: a section that is not an object, a
// partial rotary factor other than 1, a theta that is not > 0. The type is the caller's to
// accept or refuse (r.refuse(rope.type_field, ...)).
inline HfRope read_hf_rope(const HfConfigReader& r, const nlohmann::json& j, double default_theta) {
  HfRope rope;
  rope.key = r.has(j, "rope_parameters") ? "rope_parameters" : "rope_scaling";
  rope.theta = r.get<double>("rope_theta", default_theta);
  if (r.has(j, rope.key)) {
    const nlohmann::json& p = j.at(rope.key);
    rope.prefix = std::string(rope.key) + ".";
    if (!p.is_object()) r.refuse(rope.key, p, "expected an object");
    rope.parameters = &p;
    rope.theta = r.get<double>(p, rope.prefix, "rope_theta", rope.theta);
    const char* type_key = r.has(p, "rope_type") ? "rope_type" : "type";
    rope.type = r.get<std::string>(p, rope.prefix, type_key, std::string("default"));
    rope.type_field = rope.prefix + type_key;
    if (r.has(p, "partial_rotary_factor") && r.get<double>(p, rope.prefix, "partial_rotary_factor") != 1.0) {
      r.refuse(rope.prefix + "partial_rotary_factor", p.at("partial_rotary_factor"),
               "only 1.0 (rotary over the whole head) is supported");
    }
  }
  if (!(rope.theta > 0)) r.refuse("rope_theta", rope.theta, "must be > 0");
  return rope;
}

}  // namespace hyper_parallel
