// Must not compile: an element of a Sequential that is not a module (tests/CMakeLists.txt checks the message).
#include "kiln/layers/containers.h"
#include "kiln/layers/layers.h"

void build() { kiln::nn::Sequential seq{kiln::nn::ReLU(), 3}; }
