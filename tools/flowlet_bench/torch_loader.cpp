// Opens the libtorch peer module (torch_peer.hpp) on first use: next to the executable (the build
// tree), then where it is installed (FLOWLET_BENCH_MODULE_DIR). Missing: no libtorch rows.
#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>

#include <fmt/format.h>

#include "torch_peer.hpp"

namespace flowlet_bench {
namespace {

constexpr const char* kModule = "libflowlet-bench-torch.so";

struct Loaded {
  const TorchPeerApi* api = nullptr;
  std::string why = "libtorch: not built in (no " + std::string(kModule) + ")";
};

const Loaded& loaded() {
  static const Loaded result = [] {
    Loaded l;
    std::vector<std::filesystem::path> candidates;
    std::error_code error;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
    if (!error) candidates.push_back(self.parent_path() / kModule);
#ifdef FLOWLET_BENCH_MODULE_DIR
    candidates.push_back(std::filesystem::path(FLOWLET_BENCH_MODULE_DIR) / kModule);
#endif
    for (const auto& path : candidates) {
      if (!std::filesystem::exists(path, error)) continue;
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        l.why = fmt::format("libtorch: cannot load {}: {}", path.string(), dlerror());
        continue;
      }
      using Entry = const TorchPeerApi* (*)();
      auto entry = reinterpret_cast<Entry>(dlsym(handle, "flowlet_bench_torch_peer"));
      if (entry == nullptr) {
        l.why = fmt::format("libtorch: {} lacks flowlet_bench_torch_peer", path.string());
        continue;
      }
      l.api = entry();
      return l;  // the module stays loaded for the process's life
    }
    return l;
  }();
  return result;
}

}  // namespace

std::string setup_torch(int threads) {
  const Loaded& l = loaded();
  return l.api == nullptr ? l.why : l.api->setup(threads);
}

std::function<void()> torch_runner(std::string_view op, const Attributes& attributes,
                                   const std::vector<flowlet::Tensor>& inputs) {
  const Loaded& l = loaded();
  return l.api == nullptr ? std::function<void()>() : l.api->runner(op, attributes, inputs);
}

}  // namespace flowlet_bench
