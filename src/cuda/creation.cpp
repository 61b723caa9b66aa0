// Host side of the creation ops on CUDA: full, arange, randn and uniform write the (contiguous)
// output where their attributes put it.
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"
#include "ops/attributes.hpp"

namespace flowlet::detail::cuda {
namespace {

void full_kernel(const OpCall& call, std::span<Tensor> out) {
  launch_fill(out[0].raw_data(), out[0].numel(), element_type(out[0].dtype()), call.attrs<FullAttrs>().value,
              launch_on(out[0].device()));
}

void arange_kernel(const OpCall&, std::span<Tensor> out) {
  launch_arange(out[0].raw_data(), out[0].numel(), element_type(out[0].dtype()), launch_on(out[0].device()));
}

void randn_kernel(const OpCall& call, std::span<Tensor> out) {
  launch_randn(out[0].raw_data(), out[0].numel(), element_type(out[0].dtype()), call.attrs<RandomAttrs>().seed,
               launch_on(out[0].device()));
}

void uniform_kernel(const OpCall& call, std::span<Tensor> out) {
  const auto& a = call.attrs<RandomAttrs>();
  launch_uniform(out[0].raw_data(), out[0].numel(), element_type(out[0].dtype()), a.lo, a.hi, a.seed,
                 launch_on(out[0].device()));
}

}  // namespace

void add_creation_kernels(const OpList& ops) {
  set_kernel(ops, "full", &full_kernel);
  set_kernel(ops, "arange", &arange_kernel);
  set_kernel(ops, "randn", &randn_kernel);
  set_kernel(ops, "uniform", &uniform_kernel);
}

}  // namespace flowlet::detail::cuda
