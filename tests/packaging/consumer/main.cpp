// Smallest flowlet program: adds two tensors, prints the sum, checks its values.
#include <flowlet/flowlet.hpp>

#include <vector>

int main() {
  auto c = flowlet::tensor({1.0f, 2.0f}) + flowlet::tensor({3.0f, 4.0f});
  fmt::print("{}\n", c);
  return c.to_vector<float>() == std::vector<float>{4.0f, 6.0f} ? 0 : 1;
}
