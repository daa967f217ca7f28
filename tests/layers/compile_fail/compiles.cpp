// The control of the compile-fail cases: the same includes and the valid forms of each call compile.
#include "kiln/layers/containers.h"
#include "kiln/layers/layers.h"
#include "kiln/layers/models/bert.h"

void build() {
  kiln::nn::Linear lin(2, 2);
  kiln::nn::Sequential seq{std::move(lin), kiln::nn::ReLU()};
}
kiln::Tensor call(const kiln::nn::Handle<kiln::nn::models::BertLayer>& layer, const kiln::Tensor& h) {
  return layer(h, kiln::Tensor());
}
