// The CUDA launchers of the unary rows of kernels/elementwise_functors.hpp (f16 and bf16 computed in
// float); binary.cu builds the others.
#include <iterator>

#include "cuda/kernels/elementwise.cuh"

namespace flowlet::detail::cuda {
namespace {

constexpr ElementwiseLauncher kLaunchers[] = {
#define FLOWLET_UNARY_LAUNCHER(kind, name, functor, dtypes) \
  launcher_if<ElementwiseKind::kind == ElementwiseKind::unary, ElementwiseKind::kind, functor, dtypes>(),
    FLOWLET_ELEMENTWISE_OPS(FLOWLET_UNARY_LAUNCHER)
#undef FLOWLET_UNARY_LAUNCHER
};
static_assert(std::size(kLaunchers) == kElementwiseOpCount);

}  // namespace

ElementwiseLauncher unary_launcher(ElementwiseOp id) { return kLaunchers[static_cast<size_t>(id)]; }

}  // namespace flowlet::detail::cuda
