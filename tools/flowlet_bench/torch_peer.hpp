// libtorch as flowlet-bench's peer row: the libtorch call matching an op of the registry (a name ->
// ATen lambda table in torch_peer.cpp), on the same memory as flowlet's inputs (shared through
// DLPack, no copy). torch_peer.cpp is a module (libflowlet-bench-torch.so) that torch_loader.cpp
// opens on the first call here: loading libtorch costs about a second, which runs without libtorch
// rows (--list, errors, --modes eager) do not pay. Without the module every lookup finds nothing.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "flowlet/flowlet.hpp"
#include "options.hpp"

namespace flowlet_bench {

// "libtorch 1.13.0, 2 intra-op threads", or "libtorch: not built in". Sets libtorch's intra-op
// threads to `threads` (flowlet's budget) first.
std::string setup_torch(int threads);

// A callable that runs libtorch's version of `op` once on `inputs` (CPU only), or an empty one when
// the op has no libtorch mapping here or libtorch was not found at build time.
std::function<void()> torch_runner(std::string_view op, const Attributes& attributes,
                                   const std::vector<flowlet::Tensor>& inputs);

// What the module exports (extern "C" flowlet_bench_torch_peer()): the two functions above.
struct TorchPeerApi {
  std::string (*setup)(int threads);
  std::function<void()> (*runner)(std::string_view op, const Attributes& attributes,
                                  const std::vector<flowlet::Tensor>& inputs);
};

}  // namespace flowlet_bench
