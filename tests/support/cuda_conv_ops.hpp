// The issue 15 ops (src/ops/conv_attrs.hpp) whose CUDA kernels tests/test_cuda_conv.cpp checks
// row by row; tests/test_cuda.cpp's table leaves them to it.
#pragma once

#include <set>
#include <string>

namespace test {

inline const std::set<std::string> kCudaConvOps = {
    "conv2d",          "conv2d_backward_input", "conv2d_backward_weight", "max_pool2d", "max_pool2d_backward",
    "avg_pool2d",      "avg_pool2d_backward",   "batch_norm_training",    "batch_norm_backward",
    "batch_norm_inference", "layer_norm",       "layer_norm_backward",    "dropout",
};

}  // namespace test
