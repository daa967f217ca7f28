// kiln/data/hdf5/hdf5_util.h — what kiln's HDF5 readers and writers share (kiln/data/datasets/hdf5_dataset.cpp,
// kiln/io/hdf5_tensors.cpp). Internal: includes hdf5.h, so it is not installed. Callers hold data::hdf5_mutex()
// around every HDF5 call, including the closes these handles make.
#pragma once

#include <hdf5.h>

#include <utility>

namespace kiln::data::hdf5 {

// An HDF5 id closed on destruction.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// Silences HDF5's own printing of its error stack while kiln reports errors itself; restores it after.
class QuietErrors {
 public:
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// 16-bit floats: IEEE half as h5py defines it (h5py reads it as numpy float16), or bfloat16 (float32's top half).
inline Handle half_type(bool bfloat16 = false) {
  Handle t(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
  if (bfloat16) {
    H5Tset_fields(t.get(), 15, 7, 8, 0, 7);
    H5Tset_size(t.get(), 2);
    H5Tset_ebias(t.get(), 127);
  } else {
    H5Tset_fields(t.get(), 15, 10, 5, 0, 10);
    H5Tset_size(t.get(), 2);
    H5Tset_ebias(t.get(), 15);
  }
  return t;
}

}  // namespace kiln::data::hdf5
