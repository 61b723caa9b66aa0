// How each op family of the CUDA backend adds its kernels to the op table (called once, from the
// backend's add_kernels in backend.cpp, while the table is built).
#pragma once

#include <string_view>
#include <vector>

#include "flowlet/op.hpp"

namespace flowlet::detail::cuda {

using OpList = std::vector<Op*>;

// Sets `name`'s CUDA kernel; a name that is not in the table is an internal error (it throws).
void set_kernel(const OpList& ops, std::string_view name, KernelFn kernel);

void add_copy_kernels(const OpList& ops);         // copy.cpp: to_device and copy
void add_elementwise_kernels(const OpList& ops);  // elementwise.cpp
void add_creation_kernels(const OpList& ops);     // creation.cpp
void add_reduce_kernels(const OpList& ops);       // reduce.cpp
void add_linalg_kernels(const OpList& ops);       // linalg.cpp
void add_nn_kernels(const OpList& ops);           // nn.cpp
void add_shape_kernels(const OpList& ops);        // shape.cpp: concat, gather, scatter_add
// Issue 15 (ops in src/ops/conv_attrs.hpp):
void add_conv_kernels(const OpList& ops);           // conv.cpp: conv2d and its backward ops (cuDNN), pooling
void add_normalization_kernels(const OpList& ops);  // normalization.cpp: batch_norm_*, layer_norm*, dropout

}  // namespace flowlet::detail::cuda
