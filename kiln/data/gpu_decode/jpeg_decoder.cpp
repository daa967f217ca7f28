// kiln/data/gpu_decode/jpeg_decoder.cpp — nvJPEG's hardware batched decode and hybrid per-image decode.
#include "kiln/data/gpu_decode/jpeg_decoder.h"

#include <map>
#include <mutex>
#include <vector>

#include "kiln/data/gpu_decode/jpeg_structure.h"
#include "kiln/data/gpu_decode/nvjpeg_functions.h"
#include "kiln/data/gpu_decode/nvjpeg_library.h"
#include "kiln/tensor/error.h"

namespace kiln::data::gpu {

namespace {

// The process's library handles for one GPU: hardware (may be null) and hybrid. Never destroyed: decode
// states of threads that end late may still use them, and the process's exit frees them.
struct Handles {
  nvjpegHandle_t hardware = nullptr;
  nvjpegHandle_t hybrid = nullptr;
};

const Handles& handles_for(int device) {
  static std::mutex mutex;
  static std::map<int, Handles> all;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = all.find(device);
  if (it != all.end()) return it->second;
  const nvjpeg::Functions& f = nvjpeg::functions();
  cuda::DeviceGuard guard(device);
  Handles h;
  if (nvjpeg::hardware_engines_wanted()) {
    // Fails (NVJPEG_STATUS_ARCH_MISMATCH or similar) on GPUs without JPEG engines: then the hybrid one only.
    if (f.create_ex(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, 0, &h.hardware) != NVJPEG_STATUS_SUCCESS) {
      h.hardware = nullptr;
    }
  }
  const nvjpegStatus_t s = f.create_ex(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, 0, &h.hybrid);
  KILN_CHECK(s == NVJPEG_STATUS_SUCCESS, "GPU JPEG decoding: nvJPEG (", nvjpeg::library_path(),
             ") could not start on cuda:", device, ": nvjpegCreateEx: ", nvjpeg::status_text(s));
  return all.emplace(device, h).first->second;
}

void check(nvjpegStatus_t s, const char* call) {
  KILN_CHECK(s == NVJPEG_STATUS_SUCCESS, "GPU JPEG decoding: ", call, " failed: ", nvjpeg::status_text(s));
}

// Lays out JPEG's planes at in.dst for an image of `components` components with chroma subsampling `css`, its
// chroma planes chroma_w x chroma_h as nvJPEG reads them. False where the kernel cannot take them (four
// components, a subsampling nvJPEG does not name, planes of another size than the subsampling implies, or no
// room), and then the image is decoded to RGB. A grayscale image also gets two full-size chroma planes, unused:
// room for nvJPEG's YUV output, whatever it writes there.
bool plan_planes(JpegInput& in, int components, nvjpegChromaSubsampling_t css, int chroma_w, int chroma_h) {
  gpu::Planes p;
  int fx = 1, fy = 1;
  if (components == 1 || css == NVJPEG_CSS_GRAY) {
    p.layout = gpu::PixelLayout::kGray;
    chroma_w = in.width;
    chroma_h = in.height;
  } else if (components == 3) {
    switch (css) {
      case NVJPEG_CSS_444: break;
      case NVJPEG_CSS_422: fx = 2; break;
      case NVJPEG_CSS_420: fx = fy = 2; break;
      case NVJPEG_CSS_440: fy = 2; break;
      case NVJPEG_CSS_411: fx = 4; break;
      case NVJPEG_CSS_410: fx = 4, fy = 2; break;
      default: return false;
    }
    if (chroma_w != (in.width + fx - 1) / fx || chroma_h != (in.height + fy - 1) / fy) return false;
    p.layout = gpu::PixelLayout::kYCbCr;
  } else {
    return false;
  }
  auto aligned = [](size_t v) { return (v + 255) / 256 * 256; };
  const size_t chroma = static_cast<size_t>(chroma_w) * static_cast<size_t>(chroma_h);
  const size_t cb = aligned(static_cast<size_t>(in.width) * static_cast<size_t>(in.height));
  const size_t cr = aligned(cb + chroma);
  if (cr + chroma > in.capacity) return false;
  p.chroma_fx = fx;
  p.chroma_fy = fy;
  p.chroma_width = chroma_w;
  p.chroma_height = chroma_h;
  p.cb_offset = static_cast<int64_t>(cb);
  p.cr_offset = static_cast<int64_t>(cr);
  in.planes = p;
  return true;
}

}  // namespace

struct JpegDecoder::State {
  const nvjpeg::Functions* f = nullptr;
  Handles handles;
  nvjpegJpegState_t hybrid_state = nullptr;
  nvjpegJpegState_t hardware_state = nullptr;
  nvjpegJpegStream_t parsed = nullptr;  // the header of the image being sorted (hardware or not)
  int hardware_batch = -1;              // the batch size hardware_state was initialised for

  ~State() {
    if (!f) return;
    if (parsed) f->stream_destroy(parsed);
    if (hardware_state) f->state_destroy(hardware_state);
    if (hybrid_state) f->state_destroy(hybrid_state);
  }
};

namespace {
// The free decoders of each GPU. Never destroyed, as the handles: the process's exit frees them.
std::mutex g_pool_mutex;
std::map<int, std::vector<JpegDecoder*>>& free_decoders() {
  static auto* pool = new std::map<int, std::vector<JpegDecoder*>>();
  return *pool;
}
}  // namespace

void JpegDecoder::Release::operator()(JpegDecoder* decoder) const {
  if (decoder == nullptr) return;
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  free_decoders()[decoder->device_].push_back(decoder);
}

JpegDecoder::Lease JpegDecoder::acquire(int device) {
  {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    std::vector<JpegDecoder*>& free = free_decoders()[device];
    if (!free.empty()) {
      JpegDecoder* d = free.back();
      free.pop_back();
      return Lease(d);
    }
  }
  return Lease(new JpegDecoder(device));  // made outside the lock: it starts nvJPEG, which takes a while
}

JpegDecoder::JpegDecoder(int device)
    : device_(device), stream_(cuda::Stream::create(device)), state_(std::make_unique<State>()) {
  State& st = *state_;
  st.handles = handles_for(device);
  st.f = &nvjpeg::functions();
  cuda::DeviceGuard guard(device);
  check(st.f->state_create(st.handles.hybrid, &st.hybrid_state), "nvjpegJpegStateCreate");
  if (st.handles.hardware) {
    check(st.f->state_create(st.handles.hardware, &st.hardware_state), "nvjpegJpegStateCreate (hardware)");
    check(st.f->stream_create(st.handles.hardware, &st.parsed), "nvjpegJpegStreamCreate");
  }
}

JpegDecoder::~JpegDecoder() {
  try {
    stream_.synchronize();  // the states' buffers may still be in use by queued work
  } catch (...) {
  }
}

bool JpegDecoder::hardware() const { return state_->handles.hardware != nullptr; }

void JpegDecoder::keep_until(std::vector<Tensor> inputs, std::shared_ptr<cuda::Event> done) {
  if (kept_done_) kept_done_->synchronize();
  kept_ = std::move(inputs);
  kept_done_ = std::move(done);
}

size_t JpegDecoder::decode(std::span<JpegInput> images, const cuda::Stream& stream, std::vector<std::string>& errors) {
  State& st = *state_;
  const nvjpeg::Functions& f = *st.f;
  cuda::DeviceGuard guard(device_);
  auto s = static_cast<cudaStream_t>(stream.handle());
  errors.assign(images.size(), std::string());
  for (JpegInput& in : images) in.planes = gpu::Planes{};  // RGB unless planned otherwise
  auto destination = [](const JpegInput& in) {
    nvjpegImage_t img{};
    img.channel[0] = in.dst;
    if (in.planes.layout == gpu::PixelLayout::kRgb) {
      img.pitch[0] = static_cast<size_t>(in.width) * 3;
    } else {
      img.pitch[0] = static_cast<size_t>(in.width);
      img.channel[1] = in.dst + in.planes.cb_offset;
      img.channel[2] = in.dst + in.planes.cr_offset;
      img.pitch[1] = img.pitch[2] = static_cast<size_t>(in.planes.chroma_width);
    }
    return img;
  };
  auto output_format = [](const JpegInput& in) {
    return in.planes.layout == gpu::PixelLayout::kRgb ? NVJPEG_OUTPUT_RGBI : NVJPEG_OUTPUT_YUV;
  };
  // The engines' batch is decoded to planes, every image of it: the output format is the batch's.
  auto engine_planes = [&](JpegInput& in) {
    unsigned components = 0, chroma_w = 0, chroma_h = 0;
    nvjpegChromaSubsampling_t css{};
    if (f.stream_components(st.parsed, &components) != NVJPEG_STATUS_SUCCESS ||
        f.stream_subsampling(st.parsed, &css) != NVJPEG_STATUS_SUCCESS) {
      return false;
    }
    if (components == 3 && f.stream_component_size(st.parsed, 1, &chroma_w, &chroma_h) != NVJPEG_STATUS_SUCCESS) {
      return false;
    }
    return plan_planes(in, static_cast<int>(components), css, static_cast<int>(chroma_w), static_cast<int>(chroma_h));
  };

  // Sort: a file whose marker structure is broken, or that stores RGB, goes to neither decoder (the caller's
  // libjpeg-turbo decides, as on the CPU path); what the JPEG engines take goes to them in one call; the rest (and all
  // without engines) one by one.
  std::vector<size_t> engine, one_by_one;
  for (size_t i = 0; i < images.size(); ++i) {
    const JpegInspection inspection = inspect_jpeg({images[i].data, images[i].size});
    if (!inspection.problem.empty()) {
      errors[i] = "not decoded on the GPU: its JPEG structure is broken: " + inspection.problem;
      continue;
    }
    if (inspection.stores_rgb) {
      errors[i] = "not decoded on the GPU: it stores RGB, not YCbCr (nvJPEG's output assumes YCbCr)";
      continue;
    }
    int unsupported = 1;
    if (st.handles.hardware &&
        f.stream_parse(st.handles.hardware, images[i].data, images[i].size, 0, 0, st.parsed) == NVJPEG_STATUS_SUCCESS &&
        f.batched_supported(st.handles.hardware, st.parsed, &unsupported) == NVJPEG_STATUS_SUCCESS &&
        unsupported == 0 && engine_planes(images[i])) {
      engine.push_back(i);
    } else {
      one_by_one.push_back(i);  // engine_planes left its planes alone unless it put it on the engines
    }
  }
  if (!engine.empty()) {
    std::vector<const unsigned char*> data;
    std::vector<size_t> lengths;
    std::vector<nvjpegImage_t> dst;
    for (size_t i : engine) {
      data.push_back(images[i].data);
      lengths.push_back(images[i].size);
      dst.push_back(destination(images[i]));
    }
    const int n = static_cast<int>(engine.size());
    // The engines write the pixels when the call is made, not after the work queued before it on `stream`, which
    // may still read the destination (the caching allocator hands out a block freed on this stream at once: the
    // previous batch's crop kernel may be reading it): so the host waits for that work first.
    // GpuDecodeCuda.DecodeWritesAfterTheStreamsEarlierWork.
    stream.synchronize();
    nvjpegStatus_t r = NVJPEG_STATUS_SUCCESS;
    if (st.hardware_batch != n) {
      r = f.batched_initialize(st.handles.hardware, st.hardware_state, n, 1, NVJPEG_OUTPUT_YUV);
      st.hardware_batch = r == NVJPEG_STATUS_SUCCESS ? n : -1;
    }
    if (r == NVJPEG_STATUS_SUCCESS) {
      r = f.decode_batched(st.handles.hardware, st.hardware_state, data.data(), lengths.data(), dst.data(), s);
    }
    if (r != NVJPEG_STATUS_SUCCESS) {  // which image failed is not said: decode them one by one to find out
      st.hardware_batch = -1;
      for (size_t i : engine) images[i].planes = gpu::Planes{};
      one_by_one.insert(one_by_one.end(), engine.begin(), engine.end());
      engine.clear();
    }
  }
  for (size_t i : one_by_one) {
    JpegInput& in = images[i];
    int components = 0;
    nvjpegChromaSubsampling_t css{};
    int widths[NVJPEG_MAX_COMPONENT] = {}, heights[NVJPEG_MAX_COMPONENT] = {};
    nvjpegStatus_t r = f.get_image_info(st.handles.hybrid, in.data, in.size, &components, &css, widths, heights);
    if (r != NVJPEG_STATUS_SUCCESS) {
      errors[i] = "nvjpegGetImageInfo: " + nvjpeg::status_text(r);
      continue;
    }
    if (widths[0] != in.width || heights[0] != in.height) {
      errors[i] = "nvJPEG reads a " + std::to_string(heights[0]) + " x " + std::to_string(widths[0]) +
                  " image where the header parsed on the CPU says " + std::to_string(in.height) + " x " +
                  std::to_string(in.width);
      continue;
    }
    plan_planes(in, components, css, widths[1], heights[1]);  // where it cannot, the image stays RGB
    nvjpegImage_t dst = destination(in);
    r = f.decode(st.handles.hybrid, st.hybrid_state, in.data, in.size, output_format(in), &dst, s);
    if (r != NVJPEG_STATUS_SUCCESS) errors[i] = "nvjpegDecode: " + nvjpeg::status_text(r);
  }
  return engine.size();
}

}  // namespace kiln::data::gpu
