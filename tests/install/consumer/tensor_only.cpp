// A program that uses tensors only and links kiln::tensor alone. Every kiln::<module> name is the whole
// library: Tensor's methods and operators are declared in kiln/tensor/tensor.h but defined in kiln/autograd,
// so a kiln::tensor that was kiln/tensor's objects alone (the per-module static libraries kiln once built)
// could not link this program. check_consumer.cmake runs it and looks for "tensor_only ok".
#include <kiln/autograd/functions.h>  // kiln::arange (the factories are kiln/tensor's, named in namespace kiln)
#include <kiln/tensor/tensor.h>

#include <cstdlib>
#include <iostream>
#include <vector>

using namespace kiln;

int main() {
  // a = [[0, 1, 2], [3, 4, 5]]
  Tensor a = arange(6, {.dtype = DType::Float32}).reshape({2, 3});
  // By hand: (a + a).sum() = 2 * (0 + 1 + ... + 5) = 30; a a^T = [[0+1+4, 0+4+10], [0+4+10, 9+16+25]].
  const double sum = (a + a).sum().item<double>();
  const std::vector<float> product = a.matmul(a.t()).to_vector<float>();
  std::cout << "sum " << sum << ", a a^T " << a.matmul(a.t()) << "\n";
  const bool ok = sum == 30.0 && product == std::vector<float>{5.0f, 14.0f, 14.0f, 50.0f};
  std::cout << (ok ? "tensor_only ok" : "tensor_only FAILED") << "\n";
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
