// A user's 20-line training program built against an installed (and moved) kiln: a small MLP learns
// y = sin(3x) on [-1, 1] with Adam, on the CPU. check_consumer.cmake runs it and looks for "mlp ok".
#include <kiln/kiln.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

using namespace kiln;

int main() {
  manual_seed(0);
  const int64_t n = 256;
  Tensor x = linspace(-1.0, 1.0, n).reshape({n, 1});
  Tensor y = sin(x * 3.0);
  nn::Sequential model{nn::Linear(1, 32), nn::Tanh(), nn::Linear(32, 32), nn::Tanh(), nn::Linear(32, 1)};
  optim::Adam opt(model.parameters(), {.lr = 1e-2});
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    Tensor loss = nn::mse_loss(model(x), y);
    loss.backward();
    opt.step();
    last = loss.item<double>();
    if (step == 0) first = last;
  }
  // The targets' own mean square, in double: what predicting 0 would cost (about 0.51). The untrained
  // model is near it; after training the loss must be a small part of it.
  double mean_square = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double xi = -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(n - 1);
    mean_square += std::sin(3.0 * xi) * std::sin(3.0 * xi) / static_cast<double>(n);
  }
  const bool ok = std::isfinite(last) && first > 0.2 * mean_square && last < 0.02 * mean_square;
  std::printf("mlp: mse %.5f -> %.5f after 300 Adam steps (targets' mean square %.5f)\n%s\n", first, last, mean_square,
              ok ? "mlp ok" : "mlp FAILED: the loss did not fall below 2% of the targets' mean square");
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
