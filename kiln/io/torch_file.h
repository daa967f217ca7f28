// kiln/io/torch_file.h — PyTorch's torch.save files (the zip format PyTorch writes since 1.6: .pt, .pth,
// .bin), read without Python and without running any pickled code.
//
//   io::NamedTensors sd = io::load_torch_file("resnet18.pth");   // {"conv1.weight", Tensor}, ... (CPU)
//   model->load_state_dict(sd);                                   // or io::load_weights(*model, "resnet18.pth")
//
//   io::TorchFile f = io::read_torch_file("checkpoint.pt");      // {"model": {...}, "epoch": 3}
//   f.tensors;      // "model.conv1.weight", ...: nested dicts (and lists) flattened with dotted keys
//   f.other;        // {"epoch", "3"}: the leaves that are not tensors, by name with a short description
//
// What is read: dicts / OrderedDicts (string or integer keys), lists, tuples, numbers, strings, None and bools,
// and tensors rebuilt by torch._utils._rebuild_tensor_v2 / _v3 / _rebuild_parameter over typed storages
// (torch.FloatStorage, HalfStorage, BFloat16Storage, DoubleStorage, LongStorage, IntStorage, ByteStorage,
// BoolStorage, or UntypedStorage with a dtype). Any other pickled global (a class, a function, os.system)
// is refused with a kiln::Error naming it: kiln never runs pickled code. Tensors are views over their
// storage with the file's exact size, stride and offset (checked to lie within the storage), so tensors that
// share a storage in the file (tied weights) share memory in kiln too. Big-endian files, the legacy
// (pre-1.6) format and TorchScript archives are refused with a message saying what to do.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kiln/io/safetensors.h"  // io::NamedTensors

namespace kiln::io {

// What a torch.save file holds: its tensors under dotted names, and its other leaves described.
struct TorchFile {
  NamedTensors tensors{};                                    // in pickle order, CPU tensors of the file's dtypes
  std::vector<std::pair<std::string, std::string>> other{};  // non-tensor leaves: name and a short description
};

// Reads a torch.save file (see the top of this file); kiln::Error naming the file for anything it refuses.
TorchFile read_torch_file(const std::string& path);
NamedTensors load_torch_file(const std::string& path);  // read_torch_file(path).tensors

}  // namespace kiln::io
