// fuzz/fuzz_torch_file.cpp — libFuzzer targets: PyTorch torch.save files (kiln/io/torch_file.h).
//
// Two targets from this file:
//   fuzz_torch_file    any bytes as a whole .pth file (written to /dev/shm): the zip reader's checks of the end of
//                      central directory, the central directory and the local headers, then the entries' CRCs.
//   fuzz_torch_pickle  (KILN_FUZZ_PICKLE) the bytes as the archive's data.pkl, inside a valid zip (correct CRCs)
//                      that also holds byteorder, version and four storages of 64 bytes under the keys "0" to "3":
//                      the unpickler (its memory budget, set low here), the allow-list of globals and the tensor
//                      rebuild functions' checks of sizes, strides and offsets against their storage.
// kiln::Error is the expected outcome for bad input. A finding is a crash, a sanitizer report, any other exception,
// or a broken invariant: every tensor the reader returns must lie inside its storage (checked here from its sizes,
// strides and offset).
//
// Seeds: KILN_FUZZ_WRITE_SEEDS=<folder> ./fuzz_torch_file (or ./fuzz_torch_pickle) writes valid inputs of that
// target to the folder and exits (fuzz/corpus/torch_file/ and fuzz/corpus/torch_pickle/ hold them).
// KILN_FUZZ_VERBOSE=1 prints, for each input, the kiln::Error it was refused with, or what was read.
#include <unistd.h>  // getpid

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "io/torch_file_writer.h"   // an independent writer of torch.save files (tests/io)
#include "kiln/io/pickle_reader.h"  // io::set_max_unpickle_bytes
#include "kiln/io/torch_file.h"
#include "kiln/tensor/error.h"

namespace {

using namespace kiln;

constexpr int kStorages = 4;          // storages "0" .. "3" of the pickle target's archive
constexpr size_t kStorageBytes = 64;  // each

// The archive around a data.pkl (the pickle target's wrapping; the seeds' too).
std::string archive_with(const std::string& pkl) {
  test_io::ZipFile zip;
  zip.add("archive/data.pkl", pkl);
  zip.add("archive/byteorder", "little");
  for (int k = 0; k < kStorages; ++k) {
    std::string bytes(kStorageBytes, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 37 + k);
    zip.add("archive/data/" + std::to_string(k), bytes);
  }
  zip.add("archive/version", "3\n");
  return zip.bytes();
}

// A state dict's data.pkl over the archive's storages: tensors of several storage types, one a view at an offset
// with strides, two sharing a storage (tied weights).
std::string state_dict_pickle() {
  test_io::Pickle p;
  p.proto().ordered_dict().put().mark();
  p.str("w").tensor("FloatStorage", "0", 16, 0, {4, 4}, {4, 1});
  p.str("w_t").tensor("FloatStorage", "0", 16, 2, {3, 2}, {1, 4});  // a strided view at offset 2
  p.str("h").tensor("HalfStorage", "1", 32, 0, {2, 16}, {16, 1});
  p.str("i").tensor("LongStorage", "2", 8, 1, {7}, {1});
  p.str("b").tensor("BoolStorage", "3", 64, 0, {8, 8}, {8, 1});
  p.op('u').stop();
  return p.b;
}

// A checkpoint's data.pkl: a dict of a nested state dict, numbers, a string, a list and None.
std::string checkpoint_pickle() {
  test_io::Pickle p;
  p.proto().op('}').put().mark();
  p.str("model").ordered_dict().put().mark();
  p.str("layer.weight").tensor("FloatStorage", "0", 16, 0, {2, 8}, {8, 1});
  p.str("layer.bias").tensor("BFloat16Storage", "1", 32, 4, {2}, {1});
  p.op('u');
  p.str("epoch").integer(3);
  p.str("lr").binfloat(0.125);
  p.str("name").str("run");
  p.str("steps").op(']').mark().integer(1).integer(300).op('e');
  p.str("none").op('N');
  p.op('u').stop();
  return p.b;
}

void write_seeds(const std::string& folder) {
  std::filesystem::create_directories(folder);
  const std::string pickles[] = {state_dict_pickle(), checkpoint_pickle()};
  for (size_t i = 0; i < std::size(pickles); ++i) {
#ifdef KILN_FUZZ_PICKLE
    test_io::write_file(folder + "/seed-" + std::to_string(i) + ".pkl", pickles[i]);
#else
    test_io::write_file(folder + "/seed-" + std::to_string(i) + ".pth", archive_with(pickles[i]));
#endif
  }
  std::printf("wrote %zu seeds to %s\n", std::size(pickles), folder.c_str());
}

// Every element of t lies inside its storage, as the reader promised (torch_file.h): the least and the greatest
// element index its geometry reaches are within the storage's bytes; else abort (a finding).
void check_inside_storage(const Tensor& t) {
  if (t.numel() == 0) return;
  int64_t lo = t.offset(), hi = t.offset();
  for (size_t d = 0; d < t.shape().size(); ++d) {
    const int64_t reach = (t.shape()[d] - 1) * t.strides()[d];
    (reach < 0 ? lo : hi) += reach;
  }
  if (lo < 0 ||
      (hi + 1) * static_cast<int64_t>(t.element_size()) > static_cast<int64_t>(t.impl().storage()->nbytes())) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* seeds = std::getenv("KILN_FUZZ_WRITE_SEEDS")) {
    write_seeds(seeds);
    std::exit(0);
  }
  // A pickle of a few KB may ask for gigabytes (pickle_reader.h): the budget, low here, must refuse it first.
  io::set_max_unpickle_bytes(uint64_t{64} << 20);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/dev/shm/kiln_fuzz_torch_" + std::to_string(getpid()) + ".pth";
  static const bool verbose = std::getenv("KILN_FUZZ_VERBOSE") != nullptr;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
#ifdef KILN_FUZZ_PICKLE
  test_io::write_file(path, archive_with(bytes));
#else
  test_io::write_file(path, bytes);
#endif
  try {
    const io::TorchFile f = io::read_torch_file(path);
    for (const auto& [name, t] : f.tensors) check_inside_storage(t);
    if (verbose) std::printf("read %zu tensors, %zu other leaves\n", f.tensors.size(), f.other.size());
  } catch (const Error& e) {
    if (verbose) std::printf("refused: %s\n", e.what());
  }
  return 0;
}
