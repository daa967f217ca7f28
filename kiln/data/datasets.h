// kiln/data/datasets.h — the dataset formats kiln reads.
//
//   data::MNIST mnist("data/", {.split = data::Split::Train});           // IDX files, .gz or not
//   data::CIFAR10 cifar("data/", {.split = data::Split::Test});          // CIFAR binary records
//   data::HDF5Dataset h5("train.h5", {"images", "labels"});              // rows of HDF5 arrays
//   data::SyntheticDataset fake({.size = 1000, .fields = {{"x", {3, 32, 32}}}});  // random, for benchmarks
#pragma once

#include "kiln/data/datasets/cifar.h"         // data::CIFAR10, data::CIFAR100
#include "kiln/data/datasets/hdf5_dataset.h"  // data::HDF5Dataset, data::write_hdf5_arrays
#include "kiln/data/datasets/mnist.h"         // data::MNIST, data::FashionMNIST
#include "kiln/data/datasets/split.h"         // data::Split
#include "kiln/data/datasets/synthetic.h"     // data::SyntheticDataset
