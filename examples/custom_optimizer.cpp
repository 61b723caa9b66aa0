// A user-written optimizer from public ops alone: momentum SGD on the sign of the gradient
// ("signSGD with momentum"), its state in a slot variable, trained on a small regression.
#include <cstdio>

#include <flowlet/flowlet.hpp>

namespace fl = flowlet;

class SignMomentum : public fl::optim::Optimizer {
 public:
  SignMomentum(double lr, double beta) : Optimizer("sign_momentum"), lr_(lr), beta_(beta) {}

 protected:
  std::vector<std::string> slot_names() const override { return {"momentum"}; }
  void update(fl::Variable& var, const fl::Tensor& grad) override {
    fl::Variable& m = slot(var, "momentum");  // a Variable: checkpoints save it with the model
    m.assign(beta_ * m.value() + (1.0 - beta_) * grad);
    const fl::Tensor zero = fl::zeros_like(grad);
    const fl::Tensor sign = fl::where(m.value() > zero, fl::ones_like(grad), zero) -
                            fl::where(m.value() < zero, fl::ones_like(grad), zero);
    var.assign_sub(lr_ * sign);
  }

 private:
  double lr_, beta_;
};

int main() {
  const fl::Tensor x = fl::randn({256, 4}, /*seed=*/3);
  const fl::Tensor true_w = fl::tensor(std::vector<float>{0.5f, -1.0f, 2.0f, 0.0f}, fl::Shape{4, 1});
  const fl::Tensor y = fl::matmul(x, true_w);
  fl::Variable w(fl::zeros({4, 1}), "w");
  SignMomentum optimizer(/*lr=*/0.01, /*beta=*/0.9);
  float loss_value = 0.0f;
  for (int step = 0; step <= 400; ++step) {
    fl::GradientTape tape;
    const fl::Tensor loss = fl::mean(fl::square(fl::matmul(x, w) - y));
    optimizer.apply(tape.gradient(loss, {w}), {w});
    loss_value = loss.item<float>();
    if (step % 100 == 0) fmt::print("step {:3d}  loss {:.5f}\n", step, loss_value);
  }
  fmt::print("learned w = {}\noptimizer state: {} variables (step counter and one slot)\n", w.value(),
             optimizer.variables().size());
  return loss_value < 1e-2 ? 0 : 1;
}
