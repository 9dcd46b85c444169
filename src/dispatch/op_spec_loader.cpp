#include "dispatch/op_spec_loader.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "compat/file_system.h"
#include "dispatch/op_registry.h"
#include "hyper_parallel/dispatch/dispatch.h"
#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

namespace {

std::mutex& classes_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::map<std::string, DistributedOpFactory>& classes() {
  static auto* c = new std::map<std::string, DistributedOpFactory>();
  return *c;
}

std::vector<std::string> split_paths(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ':'))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string at_line(const std::string& path, const YAML::Mark& mark) {
  return path + ":" + std::to_string(mark.line + 1);
}

std::map<std::string, std::string> scalars_of(const YAML::Node& node, const std::string& where) {
  std::map<std::string, std::string> out;
  if (!node || node.IsNull()) return out;
  TORCH_CHECK(node.IsMap(), where, ": expected a map of parameters (e.g. {linearity: additive})");
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    TORCH_CHECK(kv.second.IsScalar(), at_line(where.substr(0, where.rfind(':')), kv.second.Mark()), ": parameter '",
                key, "' must be a scalar");
    out[key] = kv.second.as<std::string>();
  }
  return out;
}

}  // namespace

OpParams::OpParams(std::string op_name, std::string source, std::map<std::string, std::string> values)
    : op_name_(std::move(op_name)), source_(std::move(source)), values_(std::move(values)) {}

std::string OpParams::get(const std::string& key, const std::string& fallback) const {
  read_.insert(key);
  auto it = values_.find(key);
  return it == values_.end() ? fallback : it->second;
}

bool OpParams::get_bool(const std::string& key, bool fallback) const {
  const std::string v = get(key, fallback ? "true" : "false");
  if (v == "true" || v == "yes" || v == "1") return true;
  if (v == "false" || v == "no" || v == "0") return false;
  TORCH_CHECK(false, source_, ": parameter '", key, "' of '", op_name_, "' must be true or false, got '", v, "'");
}

std::vector<std::string> OpParams::unread_keys() const {
  std::vector<std::string> out;
  for (const auto& kv : values_)
    if (!read_.count(kv.first)) out.push_back(kv.first);
  return out;
}

void register_distributed_op_class(const std::string& class_name, DistributedOpFactory factory) {
  std::lock_guard<std::mutex> lock(classes_mutex());
  classes()[class_name] = std::move(factory);
}

std::vector<std::string> registered_op_class_names() {
  std::lock_guard<std::mutex> lock(classes_mutex());
  std::vector<std::string> out;
  for (const auto& kv : classes()) out.push_back(kv.first);
  return out;
}

void load_op_spec_files(const std::vector<OpSpecFile>& files) {
  std::map<std::string, std::string> declared_in;  // op name -> file
  for (const auto& kv : distributed_op_origins()) declared_in[kv.first] = kv.second;
  for (const auto& file : files) {
    YAML::Node root;
    try {
      root = YAML::Load(file.text);
    } catch (const YAML::Exception& e) {
      TORCH_CHECK(false, "malformed op spec ", at_line(file.path, e.mark), ": ", e.msg);
    }
    if (!root || root.IsNull()) continue;
    TORCH_CHECK(root.IsMap(), file.path, ": expected a map from op names to parameters");
    std::map<std::string, std::string> defaults;
    if (root["__default__"]) defaults = scalars_of(root["__default__"], at_line(file.path, root["__default__"].Mark()));
    for (const auto& entry : root) {
      const std::string op = entry.first.as<std::string>();
      if (op == "__default__") continue;
      const std::string where = at_line(file.path, entry.first.Mark());
      auto prev = declared_in.find(op);
      TORCH_CHECK(prev == declared_in.end(), "op '", op, "' is declared twice: in ",
                  prev == declared_in.end() ? "" : prev->second, " and in ", where);
      std::map<std::string, std::string> params = defaults;
      for (const auto& kv : scalars_of(entry.second, where)) params[kv.first] = kv.second;
      // Keys naming a context route bind the op to one of its kernels; the rest is the class's.
      std::vector<std::pair<std::string, std::string>> bindings;
      for (auto it = params.begin(); it != params.end();) {
        const auto kernels = route_kernels(it->first);
        if (kernels.empty()) {
          ++it;
          continue;
        }
        if (std::find(kernels.begin(), kernels.end(), it->second) == kernels.end()) {
          std::string known;
          for (const auto& k : kernels) known += (known.empty() ? "" : ", ") + k;
          TORCH_CHECK(false, where, ": op '", op, "' names ", it->first, " kernel '", it->second,
                      "', which does not exist; ", it->first, " kernels: ", known);
        }
        bindings.emplace_back(it->first, it->second);
        it = params.erase(it);
      }
      auto cls = params.find("class");
      TORCH_CHECK(cls != params.end(), where, ": op '", op, "' names no class (set `class:` in it or in __default__)");
      const std::string class_name = cls->second;
      params.erase(cls);
      DistributedOpFactory factory;
      {
        std::lock_guard<std::mutex> lock(classes_mutex());
        auto it = classes().find(class_name);
        if (it == classes().end()) {
          std::string known;
          for (const auto& c : classes()) known += (known.empty() ? "" : ", ") + c.first;
          TORCH_CHECK(false, where, ": unknown DistributedOp class '", class_name, "' for op '", op,
                      "'; known classes: ", known);
        }
        factory = it->second;
      }
      OpParams p(op, where, params);
      DistributedOpPtr rule = factory(p);
      const auto unread = p.unread_keys();
      TORCH_CHECK(unread.empty(), where, ": class ", class_name, " has no parameter '",
                  unread.empty() ? "" : unread.front(), "' (op '", op, "')");
      register_distributed_op(op, rule);
      for (const auto& [route, kernel] : bindings) bind_route_kernel(route, op, kernel);
      set_distributed_op_origin(op, where);
      declared_in[op] = where;
    }
  }
}

void load_op_plugins(const std::string& paths) {
  for (const auto& path : split_paths(paths)) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(handle, "HYPER_PARALLEL_OPS_PLUGIN_PATH: cannot load plugin '", path, "': ", dlerror());
    using RegisterFn = void (*)();
    auto fn = reinterpret_cast<RegisterFn>(dlsym(handle, "hyper_parallel_register_ops"));
    TORCH_CHECK(fn, "HYPER_PARALLEL_OPS_PLUGIN_PATH: plugin '", path,
                "' does not export the symbol hyper_parallel_register_ops (expected "
                "extern \"C\" void hyper_parallel_register_ops())");
    const auto before = registered_op_names();
    fn();
    for (const auto& name : registered_op_names()) {
      if (std::find(before.begin(), before.end(), name) == before.end()) {
        set_distributed_op_origin(name, "plugin " + path);
      }
    }
  }
}

std::vector<OpSpecFile> read_op_spec_dirs(const std::string& dirs) {
  std::vector<OpSpecFile> out;
  for (const auto& dir : split_paths(dirs)) {
    TORCH_CHECK(compat::is_directory(dir), "HYPER_PARALLEL_OPS_YAML_DIR: '", dir, "' is not a directory");
    for (const auto& name : compat::list_directory(dir)) {  // sorted
      if (!name.ends_with(".yaml") && !name.ends_with(".yml")) continue;
      const std::string f = compat::join_path(dir, name);
      std::ifstream in(f);
      std::stringstream ss;
      ss << in.rdbuf();
      out.push_back({f, ss.str()});
    }
  }
  return out;
}

}  // namespace hyper_parallel
