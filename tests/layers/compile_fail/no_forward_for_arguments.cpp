// Must not compile: BertLayer has no forward of one tensor (only forward(hidden, mask)).
#include "kiln/layers/models/bert.h"

kiln::Tensor call(const kiln::nn::Handle<kiln::nn::models::BertLayer>& layer, const kiln::Tensor& h) {
  return layer(h);
}
