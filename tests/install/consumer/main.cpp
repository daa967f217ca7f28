// A user's program built against an installed kiln: one header, one target.
#include <kiln/kiln.h>

#include <cstdlib>
#include <iostream>

using namespace kiln;

int main() {
  Tensor x = zeros({2, 3});  // (2, 3) float32 on the CPU
  std::cout << "kiln " << KILN_VERSION_STRING << ": zeros " << x.shape() << " " << x.dtype() << " on " << x.device()
            << ", " << x.numel() << " elements\n"
            << x << "\n";
  // check_consumer.cmake looks for this line to know the program ran to the end.
  const bool ok = x.dim() == 2 && x.numel() == 6 && x.dtype() == DType::Float32 && x.is_cpu();
  std::cout << (ok ? "consumer ok" : "consumer FAILED") << "\n";
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
