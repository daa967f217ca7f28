// kiln/layers/layers.h — the simple layers as modules, in one include: Linear, Dropout, Embedding, the
// normalisations, the activations, Flatten and Identity. PyTorch's parameter names and default initialisation.
// Each lives in a header of its own (below), which a program may include instead.
//
//   using namespace kiln;
//   auto fc = std::make_shared<nn::Linear>(784, 10);                 // "weight" (10, 784), "bias" (10)
//   auto head = std::make_shared<nn::Linear>(256, 2, nn::LinearOptions{.bias = false});
//   auto bn = std::make_shared<nn::BatchNorm2d>(64, nn::BatchNormOptions{.momentum = 0.01});
//   auto drop = std::make_shared<nn::Dropout>(0.1);
//   Tensor y = (*fc)(x);                                              // x (N, 784) -> (N, 10)
//
// Parameters are created on the CPU in float32; move a model with to(). Each layer checks its input's rank
// and feature size and names itself, the expected and the given shapes in the error.
#pragma once

#include "kiln/layers/activation.h"     // nn::ReLU, GELU, SiLU, Tanh, Sigmoid, Softmax
#include "kiln/layers/dropout.h"        // nn::Dropout
#include "kiln/layers/embedding.h"      // nn::Embedding
#include "kiln/layers/flatten.h"        // nn::Flatten
#include "kiln/layers/fp8_linear.h"     // amp::prepare_fp8, nn::fp8_linear: Linear layers in FP8
#include "kiln/layers/identity.h"       // nn::Identity
#include "kiln/layers/linear.h"         // nn::Linear
#include "kiln/layers/normalization.h"  // nn::LayerNorm, GroupNorm, BatchNorm1d/2d (and BatchNormStatsReducer)
