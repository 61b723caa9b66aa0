// Builds ElementwiseArgs from tensors with the CPU engine's dimension merging.
#include "cuda/elementwise_args.hpp"

#include "core/check.hpp"
#include "kernels/elementwise_loop.hpp"

namespace flowlet::detail::cuda {

template <size_t N>
ElementwiseArgs elementwise_args(std::string_view op, const Tensor& out, const std::array<const Tensor*, N - 1>& inputs) {
  static_assert(N <= kMaxOperands);
  const MergedLayout<N> layout = merge_dimensions<N>(out, inputs);
  if (layout.shape.size() > static_cast<size_t>(kMaxDims)) {
    fail<ShapeError>("{}: CUDA elementwise kernels take at most {} dimensions after merging; got output shape {} "
                     "with {} dimensions that cannot merge; make the inputs contiguous first",
                     op, kMaxDims, out.shape(), layout.shape.size());
  }
  ElementwiseArgs args;
  args.numel = out.numel();
  args.dims = static_cast<int>(layout.shape.size());
  for (size_t d = 0; d < layout.shape.size(); ++d) args.sizes[d] = layout.shape[d];
  args.data[0] = out.raw_data();
  for (size_t k = 1; k < N; ++k) args.data[k] = inputs[k - 1]->raw_data();
  for (size_t k = 0; k < N; ++k) {
    for (size_t d = 0; d < layout.shape.size(); ++d) args.strides[k][d] = layout.strides[k][d];
  }
  return args;
}

template ElementwiseArgs elementwise_args<2>(std::string_view, const Tensor&, const std::array<const Tensor*, 1>&);
template ElementwiseArgs elementwise_args<3>(std::string_view, const Tensor&, const std::array<const Tensor*, 2>&);
template ElementwiseArgs elementwise_args<4>(std::string_view, const Tensor&, const std::array<const Tensor*, 3>&);

}  // namespace flowlet::detail::cuda
