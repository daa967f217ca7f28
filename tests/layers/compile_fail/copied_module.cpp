// Must not compile: a module lvalue would have to be copied into the Sequential.
#include "kiln/layers/containers.h"
#include "kiln/layers/layers.h"

void build() {
  kiln::nn::Linear lin(2, 2);
  kiln::nn::Sequential seq{lin, kiln::nn::ReLU()};
}
