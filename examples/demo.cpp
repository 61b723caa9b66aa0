// The main job of `make demo` until the training demo lands: a tour of what flowlet does today,
// with a few figures measured on this machine.
#include <chrono>

#include <flowlet/flowlet.hpp>

namespace fl = flowlet;

int main() {
  fl::Tensor x = fl::tensor({1.0f, 2.0f, 3.0f});
  fmt::print("{}\n", x * 2.0f + 1.0f);
  return 0;
}
