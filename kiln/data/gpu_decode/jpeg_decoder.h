// kiln/data/gpu_decode/jpeg_decoder.h — one thread's nvJPEG decoder on one GPU (private to kiln_data; builds
// with nvjpeg.h only).
//
//   gpu::JpegDecoder::Lease dec = gpu::JpegDecoder::acquire(device);  // from the process's pool, made on need
//   std::vector<std::string> errors;
//   dec->decode(images, dec->stream(), errors);  // queued on the stream; errors[i] empty when queued fine
//
// Each image is decoded at its `dst` (device memory the caller owns): as JPEG's own planes (luma and subsampled
// chroma, or luma alone; where they lie goes to its `planes`) wherever nvJPEG can give them, which spares the
// conversion to RGB that nvJPEG would otherwise run as a kernel per image (crop_resize.cu converts while it
// samples); else as interleaved RGB (H, W, 3) uint8.
// Images are decoded one by one by nvJPEG's default (hybrid) backend: Huffman decoding on this thread's CPU, the
// rest on the GPU. With KILN_NVJPEG_HARDWARE=1 (nvjpeg::hardware_engines_wanted(), off by default: see there), on
// a GPU with JPEG decoding engines (A100, H100, H200: nvJPEG's hardware backend) the images they take (baseline,
// not 4:1:0/4:1:1) go to them in one nvjpegDecodeBatched call instead. The library handles are the process's (one per
// GPU, made once). Decoders (their decode states, which hold per-image buffers, and their streams) live in a pool per
// GPU: a loader's worker threads end with each epoch, and making a decoder allocates and frees device memory (which
// waits for the whole GPU), so each batch leases one and gives it back. One thread uses a leased decoder at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/data/gpu_decode/crop_resize.h"  // Planes
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/tensor.h"

namespace kiln::data::gpu {

struct JpegInput {
  const uint8_t* data = nullptr;  // the file's bytes (host)
  size_t size = 0;
  uint8_t* dst = nullptr;  // device: `capacity` bytes, at least height * width * 3 + kPlanesSlack
  size_t capacity = 0;
  int height = 0, width = 0;
  Planes planes;  // set by decode(): how the decoded pixels lie at dst
};

// The bytes beyond height * width * 3 that an image's planes may need (each plane starts 256-byte aligned).
inline constexpr size_t kPlanesSlack = 512;

class JpegDecoder {
 public:
  // Gives a leased decoder back to its pool.
  struct Release {
    void operator()(JpegDecoder* decoder) const;
  };
  using Lease = std::unique_ptr<JpegDecoder, Release>;
  // A free decoder for `device` from the pool, or a new one (throws, saying how to install nvJPEG, when it is
  // missing).
  static Lease acquire(int device);

  explicit JpegDecoder(int device);
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Queues every image's decode on `stream` and sets its `planes`. errors[i]: empty, or what nvJPEG said about
  // image i (nothing was written for it; the caller may decode it another way). Returns how many went to the JPEG
  // engines (the others without an error went one at a time to the default backend). The pixels are written
  // after the work queued on `stream` before the call (for the engines, which write at once, the host waits for
  // that work first).
  size_t decode(std::span<JpegInput> images, const cuda::Stream& stream, std::vector<std::string>& errors);

  // Keeps `inputs` (the host memory a batch's decode reads: the files' bytes) alive until `done` has happened:
  // the decode reads them while it runs on the GPU. They are let go at the next call, after a host wait on the
  // previous `done`, which has long happened by then in a loader (its worker reads a batch of files first).
  void keep_until(std::vector<Tensor> inputs, std::shared_ptr<cuda::Event> done);

  const cuda::Stream& stream() const { return stream_; }  // this decoder's own stream (the caller may use it)
  bool hardware() const;                                  // the GPU's JPEG engines are in use

  struct State;

 private:
  int device_;
  cuda::Stream stream_;
  std::unique_ptr<State> state_;
  std::vector<Tensor> kept_;  // keep_until's inputs, until kept_done_
  std::shared_ptr<cuda::Event> kept_done_;
};

}  // namespace kiln::data::gpu
