// optimize: the pass order, the graph dumps around each pass, and the invariant checks between them.
//
// Order: prune first (later passes then skip dead code), simplify (exposes constants and
// duplicates), fold, CSE (folded constants and simplified nodes merge), simplify again (CSE and
// folding create new x*1 and neg(neg(x)) shapes), place, fuse (convolutions and dense layers
// first: elementwise fusion would absorb the relu they take), prune what the rewrites left unused,
// then cut the edges between devices into Send/Recv pairs (which also compacts the node list).
// Relies on and keeps what every pass does (flowlet/graph.hpp); in builds without NDEBUG,
// check_invariants() runs after each pass (and after its dump, so the broken graph is on disk).
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "core/check.hpp"
#include "core/user_text.hpp"
#include "trace/passes/passes.hpp"

namespace flowlet::detail {
namespace {

// Numbers optimize() calls, so the dumps of several traced functions sit side by side.
std::atomic<int64_t> optimize_calls{0};

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
  file.close();
  if (!file) fail<InvalidArgument>("optimize: cannot write graph dump {}", path.string());
}

class Dumper {
 public:
  explicit Dumper(const PassOptions& options) {
    std::string dir = options.dump_dir;
    if (dir.empty()) {
      if (const char* env = std::getenv("FLOWLET_DUMP_GRAPHS"); env != nullptr) dir = env;
    }
    if (dir.empty()) return;
    check_path("optimize", "the graph dump folder", dir);
    dir_ = dir;
    std::error_code error;
    std::filesystem::create_directories(dir_, error);
    if (error) {
      fail<InvalidArgument>(
          "optimize: cannot create the graph dump folder {}; got {}; set PassOptions::dump_dir (or "
          "FLOWLET_DUMP_GRAPHS) to a writable folder",
          dir_.string(), error.message());
    }
    sequence_ = optimize_calls.fetch_add(1, std::memory_order_relaxed);
  }

  // Writes <dir>/<sequence>_<step>_<pass>.dot and .json.
  void dump(const Graph& graph, std::string_view pass) {
    if (dir_.empty()) return;
    const std::string stem = fmt::format("{:03}_{:02}_{}", sequence_, step_++, pass);
    write_file(dir_ / (stem + ".dot"), graph.to_dot());
    write_file(dir_ / (stem + ".json"), graph.to_json());
  }

 private:
  std::filesystem::path dir_;
  int64_t sequence_ = 0;
  int step_ = 0;
};

}  // namespace

void optimize(Graph& graph, const PassOptions& options) {
  Dumper dumper(options);
  dumper.dump(graph, "traced");
  auto run = [&](std::string_view name, bool enabled, void (*pass)(Graph&)) {
    if (!enabled) return;
    pass(graph);
    dumper.dump(graph, name);  // first, so a graph that fails the check below can be looked at
#ifndef NDEBUG
    graph.check_invariants();
#endif
  };
  run("prune", true, &prune);
  run("simplify_algebra", options.simplify, &simplify_algebra);
  run("fold_constants", options.fold_constants, &fold_constants);
  run("eliminate_common_subexpressions", options.eliminate_common_subexpressions, &eliminate_common_subexpressions);
  run("simplify_algebra", options.simplify, &simplify_algebra);
  run("place", true, &place);
  run("fuse_convolutions", options.fuse_convolutions && conv_fusion_enabled_by_environment(), &fuse_convolutions);
  const bool dense = dense_fusion_enabled_by_environment();
  run("fuse_matmul_bias", options.fuse_matmul_bias && dense, &fuse_matmul_bias);
  run("fuse_relu_bias_grad", options.fuse_relu_bias_grad && dense, &fuse_relu_bias_grad);
  run("fuse_cross_entropy_grad", options.fuse_cross_entropy_grad && dense, &fuse_cross_entropy_grad);
  run("fuse_variable_updates", options.fuse_variable_updates, &fuse_variable_updates);
  run("fuse_elementwise", options.fuse_elementwise, &fuse_elementwise);
  run("prune", true, &prune);
  run("insert_send_recv", true, &insert_send_recv);  // also compacts
}

}  // namespace flowlet::detail
