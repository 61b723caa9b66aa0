// Ops that reach the host when they run: printing and callbacks. Eagerly they run at once; in a
// traced function they run every time the graph runs, in program order (unlike plain C++ code in
// the function, which runs once, when it is traced).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "flowlet/core/tensor.hpp"

namespace flowlet {

// Writes "label: <t>" (values, shape and dtype) to standard error and returns t.
//   Tensor h = print(relu(x), "hidden");
Tensor print(const Tensor& t, std::string label = "");

// Calls fn with the values of `inputs` (concrete tensors, even inside a traced function).
//   host_callback([](const std::vector<Tensor>& v) { log(v[0].item<float>()); }, {loss});
void host_callback(std::function<void(const std::vector<Tensor>&)> fn, std::vector<Tensor> inputs);

}  // namespace flowlet
