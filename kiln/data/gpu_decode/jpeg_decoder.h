// kiln/data/gpu_decode/jpeg_decoder.h — one thread's nvJPEG decoder on one GPU (private to kiln_data; builds
// with nvjpeg.h only).
//
//   auto& dec = gpu::JpegDecoder::for_thread(device);      // made on first use, kept for the thread's life
//   std::vector<std::string> errors;
//   dec.decode(images, stream, errors);                     // queued on `stream`; errors[i] empty when queued fine
//
// Each image is decoded to interleaved RGB (H, W, 3) uint8 at its `dst` (device memory the caller owns).
// Where the GPU has JPEG decoding engines (A100, H100, H200: nvJPEG's hardware backend) the images they take
// (baseline, not 4:1:0/4:1:1) go to them in one nvjpegDecodeBatched call; the rest are decoded one by one by
// the hybrid backend (Huffman decoding on this thread's CPU, the rest on the GPU). Set KILN_NVJPEG_HARDWARE=0
// to use the hybrid backend only. The library handles are the process's (one per GPU, made once); the decode
// states, which hold per-image buffers, are this thread's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/tensor/cuda.h"

namespace kiln::data::gpu {

struct JpegInput {
  const uint8_t* data = nullptr;  // the file's bytes (host)
  size_t size = 0;
  uint8_t* dst = nullptr;  // device: height * width * 3 bytes
  int height = 0, width = 0;
};

class JpegDecoder {
 public:
  // This thread's decoder for `device` (throws, saying how to install nvJPEG, when it is missing).
  static JpegDecoder& for_thread(int device);

  explicit JpegDecoder(int device);
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Queues every image's decode on `stream`. errors[i]: empty, or what nvJPEG said about image i (nothing was
  // written for it; the caller may decode it another way).
  void decode(std::span<const JpegInput> images, const cuda::Stream& stream, std::vector<std::string>& errors);

  const cuda::Stream& stream() const { return stream_; }  // this decoder's own stream (the caller may use it)
  bool hardware() const;                                  // the GPU's JPEG engines are in use

  struct State;

 private:
  int device_;
  cuda::Stream stream_;
  std::unique_ptr<State> state_;
};

}  // namespace kiln::data::gpu
