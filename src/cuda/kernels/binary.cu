// The CUDA launchers of the binary, comparison and ternary rows of kernels/elementwise_functors.hpp
// (the unary rows are unary.cu's, so that the two halves compile in parallel).
#include <iterator>

#include "cuda/kernels/elementwise.cuh"

namespace flowlet::detail::cuda {
namespace {

constexpr ElementwiseLauncher kLaunchers[] = {
#define FLOWLET_BINARY_LAUNCHER(kind, name, functor, dtypes) \
  launcher_if<ElementwiseKind::kind != ElementwiseKind::unary, ElementwiseKind::kind, functor, dtypes>(),
    FLOWLET_ELEMENTWISE_OPS(FLOWLET_BINARY_LAUNCHER)
#undef FLOWLET_BINARY_LAUNCHER
};
static_assert(std::size(kLaunchers) == kElementwiseOpCount);

}  // namespace

ElementwiseLauncher binary_launcher(ElementwiseOp id) { return kLaunchers[static_cast<size_t>(id)]; }

}  // namespace flowlet::detail::cuda
