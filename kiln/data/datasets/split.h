// kiln/data/datasets/split.h — which part of a dataset with a fixed train/test split to read.
//
//   data::MNIST test("data/", {.split = data::Split::Test});
#pragma once

namespace kiln::data {

// Which part of a dataset with a fixed train/test split to read (MNIST, CIFAR).
enum class Split { Train, Test };

}  // namespace kiln::data
