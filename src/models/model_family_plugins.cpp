// Model families from shared libraries, loaded as the op rules' plugins are
// (HYPER_PARALLEL_OPS_PLUGIN_PATH, src/dispatch/op_spec_loader.cpp): dlopen, then the
// library's one extern "C" entry point, which calls register_model_family.
#include <dlfcn.h>

#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "hyper_parallel/models/model_registry.h"

namespace hyper_parallel {

namespace {

constexpr const char* kEntryPoint = "hyper_parallel_register_model_families";

// The libraries whose families registered, by path: a second load of one is a no-op, not a
// second registration of its families (a load that failed is tried again, and fails again).
struct LoadedPlugins {
  std::mutex mutex;
  std::set<std::string> paths;
};

LoadedPlugins& loaded_plugins() {
  static LoadedPlugins loaded;
  return loaded;
}

void load_plugin(const std::string& path) {
  {
    LoadedPlugins& loaded = loaded_plugins();
    std::lock_guard<std::mutex> lock(loaded.mutex);
    if (loaded.paths.count(path)) return;
  }
  // RTLD_GLOBAL: the family's code may be reached from later plugins, as for op plugins.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!handle) {
    const char* why = dlerror();
    throw std::invalid_argument(std::string(kModelPluginPathVariable) + ": cannot load model family plugin '" + path +
                                "': " + (why ? why : "unknown error"));
  }
  using RegisterFn = void (*)();
  auto fn = reinterpret_cast<RegisterFn>(dlsym(handle, kEntryPoint));
  if (!fn) {
    throw std::invalid_argument(std::string(kModelPluginPathVariable) + ": model family plugin '" + path +
                                "' does not export the symbol " + kEntryPoint + " (expected extern \"C\" void " +
                                kEntryPoint + "())");
  }
  fn();
  LoadedPlugins& loaded = loaded_plugins();
  std::lock_guard<std::mutex> lock(loaded.mutex);
  loaded.paths.insert(path);
}

}  // namespace

void load_model_family_plugins(const std::string& paths) {
  std::stringstream list(paths);
  std::string path;
  while (std::getline(list, path, ':')) {
    if (!path.empty()) load_plugin(path);
  }
}

}  // namespace hyper_parallel
