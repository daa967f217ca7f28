// Experiment: every execution plan cuDNN offers for BERT's attention in training, forward and backward, timed.
// Shapes: BERT-base 128 x 12 x 128 x 64 and BERT-large 64 x 16 x 128 x 64, bf16, q, k, v as the thirds of one
// (batch, tokens, 3 x heads x 64) projection output (as kiln's BertSelfAttention gives them), O and dO in
// (batch, tokens, heads, 64) memory. Variants of the mask: none; kiln's (a (batch, 1, tokens, tokens) bias, 0 or
// -30000, the last 16 keys of every other sequence masked); the same as one row per sequence, (batch, 1, 1, tokens)
// in memory, read for every query through a zero stride ("keybias"); cuDNN's padding mask (seq_len_q = tokens,
// seq_len_kv = tokens or tokens - 16). Dropout 0.1 or none. Implementation: AUTO, and COMPOSITE and UNIFIED where they
// build. Heuristics A and FALLBACK, every plan built; each plan's median of 20 runs after 3 (CUDA events around one
// run).
//
//   g++ -std=c++20 -O2 -I third_party/cudnn_frontend/include -I /usr/local/cuda/include \
//       bench/experiments/sdpa_plans.cpp -L /usr/local/cuda/lib -L /usr/local/cuda/lib64 -lcudnn -lnvrtc -lcudart \
//       -o sdpa_plans
//
// Not part of the build (its cuDNN frontend headers take a minute to compile): a measurement, run where a choice
// of cuDNN's attention plans or masking modes is to be made.
#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;
using Dims = std::vector<int64_t>;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

namespace {

enum : int64_t { kQ = 1, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kBias, kSeed, kOffset, kSeqQ, kSeqKV };

#define CUDA_OK(x)                                                                            \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

void* device_bytes(size_t n, int fill = 0) {
  void* p = nullptr;
  CUDA_OK(cudaMalloc(&p, n));
  CUDA_OK(cudaMemset(p, fill, n));
  return p;
}

// bf16 values of small magnitude (0.01 x a pattern), so that softmax is well conditioned.
void* device_bf16(size_t count) {
  std::vector<uint16_t> h(count);
  for (size_t i = 0; i < count; ++i) {
    const float v = 0.01f * static_cast<float>(static_cast<int>((i * 2654435761u) % 201) - 100);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    h[i] = static_cast<uint16_t>(bits >> 16);
  }
  void* p = device_bytes(count * 2);
  CUDA_OK(cudaMemcpy(p, h.data(), count * 2, cudaMemcpyHostToDevice));
  return p;
}

struct Case {
  const char* model;
  int64_t B, H, S, D;
};
struct Variant {
  const char* mask;  // "none", "bias", "keybias", "padding"
  float dropout;
  fe::AttentionImplementation_t impl;
  const char* impl_name;
};

TensorAttr add(fe::graph::Graph& g, const char* name, int64_t uid, Dims dims, Dims strides,
               fe::DataType_t type = fe::DataType_t::NOT_SET) {
  auto attr = fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(strides);
  if (type != fe::DataType_t::NOT_SET) attr.set_data_type(type);
  return g.tensor(attr);
}

template <typename Attributes>
void set_common(Attributes& a, fe::graph::Graph& g, const Case& c, const Variant& v) {
  a.set_attn_scale(0.125f);
  if (std::strcmp(v.mask, "bias") == 0) {
    a.set_bias(add(g, "bias", kBias, {c.B, 1, c.S, c.S}, {c.S * c.S, c.S * c.S, c.S, 1}));
  } else if (std::strcmp(v.mask, "keybias") == 0) {
    a.set_bias(add(g, "bias", kBias, {c.B, 1, c.S, c.S}, {c.S, c.S, 0, 1}));
  } else if (std::strcmp(v.mask, "padding") == 0) {
    a.set_padding_mask(true)
        .set_seq_len_q(add(g, "seq_q", kSeqQ, {c.B, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT32))
        .set_seq_len_kv(add(g, "seq_kv", kSeqKV, {c.B, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT32));
  }
  if (v.dropout > 0) {
    a.set_dropout(v.dropout, add(g, "seed", kSeed, {1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT64),
                  add(g, "offset", kOffset, {1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT64));
  }
}

std::shared_ptr<fe::graph::Graph> build(const Case& c, const Variant& v, bool backward, cudnnHandle_t handle,
                                        std::string& why) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t B = c.B, H = c.H, S = c.S, D = c.D, HD = H * D;
  const Dims packed = {S * 3 * HD, D, 3 * HD, 1};  // a third of (B, S, 3 H D), seen as (B, H, S, D)
  const Dims bshd = {S * HD, D, HD, 1};            // (B, S, H, D) memory seen as (B, H, S, D)
  auto Q = add(*g, "q", kQ, {B, H, S, D}, packed);
  auto K = add(*g, "k", kK, {B, H, S, D}, packed);
  auto V = add(*g, "v", kV, {B, H, S, D}, packed);
  if (!backward) {
    fe::graph::SDPA_attributes a;
    a.set_name("sdpa").set_generate_stats(true);
    if (v.impl != fe::AttentionImplementation_t::AUTO) a.set_implementation(v.impl);
    set_common(a, *g, c, v);
    auto [O, stats] = g->sdpa(Q, K, V, std::move(a));
    O->set_output(true).set_uid(kO).set_dim({B, H, S, D}).set_stride(bshd);
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({B, H, S, 1})
        .set_stride({H * S, S, 1, 1});
  } else {
    auto O = add(*g, "o", kO, {B, H, S, D}, bshd);
    auto dO = add(*g, "d_o", kDO, {B, H, S, D}, bshd);
    auto stats = add(*g, "stats", kStats, {B, H, S, 1}, {H * S, S, 1, 1}, fe::DataType_t::FLOAT);
    fe::graph::SDPA_backward_attributes a;
    a.set_name("sdpa_backward");
    set_common(a, *g, c, v);
    auto grads = g->sdpa_backward(Q, K, V, O, dO, stats, std::move(a));
    grads[0]->set_output(true).set_uid(kDQ).set_dim({B, H, S, D}).set_stride(packed);
    grads[1]->set_output(true).set_uid(kDK).set_dim({B, H, S, D}).set_stride(packed);
    grads[2]->set_output(true).set_uid(kDV).set_dim({B, H, S, D}).set_stride(packed);
  }
  auto step = [&](fe::error_t s, const char* what) {
    if (s.is_good()) return true;
    why = std::string(what) + ": " + s.get_message();
    return false;
  };
  if (!step(g->validate(), "validate") || !step(g->build_operation_graph(handle), "build_operation_graph") ||
      !step(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans") ||
      !step(g->check_support(), "check_support") || !step(g->build_plans(fe::BuildPlanPolicy_t::ALL), "build_plans")) {
    return nullptr;
  }
  return g;
}

float median_ms(const std::function<bool()>& run, cudaStream_t stream) {
  for (int i = 0; i < 3; ++i) {
    if (!run()) return -1;
  }
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < 20; ++i) {
    CUDA_OK(cudaEventRecord(a, stream));
    if (!run()) return -1;
    CUDA_OK(cudaEventRecord(b, stream));
    CUDA_OK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void run_case(const Case& c, const Variant& v, cudnnHandle_t handle, cudaStream_t stream) {
  const int64_t B = c.B, H = c.H, S = c.S, D = c.D, HD = H * D;
  char* qkv = static_cast<char*>(device_bf16(static_cast<size_t>(B * S * 3 * HD)));
  void* o = device_bf16(static_cast<size_t>(B * S * HD));
  void* d_o = device_bf16(static_cast<size_t>(B * S * HD));
  void* stats = device_bytes(static_cast<size_t>(B * H * S) * 4);
  char* dqkv = static_cast<char*>(device_bytes(static_cast<size_t>(B * S * 3 * HD) * 2));
  // The bias: 0 where a key may be seen, -30000 (bf16 0xC6EA) for the last 16 keys of every other sequence.
  std::vector<uint16_t> bias_h(static_cast<size_t>(B * S * S), 0);
  for (int64_t b = 1; b < B; b += 2)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = S - 16; j < S; ++j) bias_h[static_cast<size_t>((b * S + i) * S + j)] = 0xC6EA;
  void* bias = device_bytes(bias_h.size() * 2);
  CUDA_OK(cudaMemcpy(bias, bias_h.data(), bias_h.size() * 2, cudaMemcpyHostToDevice));
  void* key_bias = device_bytes(static_cast<size_t>(B * S) * 2);  // row i = 0 of each sequence's bias
  for (int64_t b = 0; b < B; ++b)
    CUDA_OK(
        cudaMemcpy(static_cast<char*>(key_bias) + b * S * 2, bias_h.data() + b * S * S, S * 2, cudaMemcpyHostToDevice));
  std::vector<int32_t> seq_q_h(static_cast<size_t>(B), static_cast<int32_t>(S)), seq_kv_h(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) seq_kv_h[static_cast<size_t>(b)] = static_cast<int32_t>(b % 2 == 1 ? S - 16 : S);
  void* seq_q = device_bytes(static_cast<size_t>(B) * 4);
  void* seq_kv = device_bytes(static_cast<size_t>(B) * 4);
  CUDA_OK(cudaMemcpy(seq_q, seq_q_h.data(), static_cast<size_t>(B) * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(seq_kv, seq_kv_h.data(), static_cast<size_t>(B) * 4, cudaMemcpyHostToDevice));
  int64_t seed_h = 1234, offset_h = 0;
  void* seed = device_bytes(8);
  void* offset = device_bytes(8);
  CUDA_OK(cudaMemcpy(seed, &seed_h, 8, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(offset, &offset_h, 8, cudaMemcpyHostToDevice));
  std::unordered_map<int64_t, void*> pack = {
      {kQ, qkv},      {kK, qkv + HD * 2},   {kV, qkv + 2 * HD * 2},   {kO, o},       {kDO, d_o},    {kStats, stats},
      {kDQ, dqkv},    {kDK, dqkv + HD * 2}, {kDV, dqkv + 2 * HD * 2}, {kBias, bias}, {kSeed, seed}, {kOffset, offset},
      {kSeqQ, seq_q}, {kSeqKV, seq_kv}};
  if (std::strcmp(v.mask, "keybias") == 0) pack[kBias] = key_bias;
  for (bool backward : {false, true}) {
    std::string why;
    auto g = build(c, v, backward, handle, why);
    const char* dir = backward ? "bwd" : "fwd";
    if (g == nullptr) {
      std::printf("%-5s %-3s mask=%-7s dropout=%.1f impl=%-9s  not built (%s)\n", c.model, dir, v.mask, v.dropout,
                  v.impl_name, why.substr(0, 140).c_str());
      continue;
    }
    const int64_t count = g->get_execution_plan_count();
    for (int64_t i = 0; i < count; ++i) {
      int64_t ws_bytes = 0;
      if (g->get_workspace_size_plan_at_index(i, ws_bytes).is_bad()) continue;
      void* ws = ws_bytes > 0 ? device_bytes(static_cast<size_t>(ws_bytes)) : nullptr;
      std::string name;
      (void)g->get_plan_name_at_index(i, name);
      // The tensors this graph has: the direction's own, and the mask's and dropout's.
      std::vector<int64_t> uids = backward ? std::vector<int64_t>{kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV}
                                           : std::vector<int64_t>{kQ, kK, kV, kO, kStats};
      if (std::strcmp(v.mask, "bias") == 0 || std::strcmp(v.mask, "keybias") == 0) uids.push_back(kBias);
      if (std::strcmp(v.mask, "padding") == 0) uids.insert(uids.end(), {kSeqQ, kSeqKV});
      if (v.dropout > 0) uids.insert(uids.end(), {kSeed, kOffset});
      std::unordered_map<int64_t, void*> used;
      for (int64_t uid : uids) used[uid] = pack.at(uid);
      const float ms = median_ms([&] { return g->execute_plan_at_index(handle, used, ws, i).is_good(); }, stream);
      std::printf("%-5s %-3s mask=%-7s dropout=%.1f impl=%-9s plan %lld/%lld %-48s %8.4f ms\n", c.model, dir, v.mask,
                  v.dropout, v.impl_name, static_cast<long long>(i), static_cast<long long>(count),
                  name.substr(0, 48).c_str(), ms);
      if (ws != nullptr) cudaFree(ws);
    }
  }
  for (void* p :
       {static_cast<void*>(qkv), o, d_o, stats, static_cast<void*>(dqkv), bias, key_bias, seq_q, seq_kv, seed, offset})
    cudaFree(p);
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("sdpa_plans: no GPU visible\n");
    return 0;
  }
  cudnnHandle_t handle;
  if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) {
    std::printf("sdpa_plans: cudnnCreate failed\n");
    return 1;
  }
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  cudnnSetStream(handle, stream);
  std::printf("cuDNN %zu, frontend %d\n", cudnnGetVersion(), CUDNN_FRONTEND_VERSION);
  const Case cases[] = {{"base", 128, 12, 128, 64}, {"large", 64, 16, 128, 64}};
  const Variant variants[] = {
      {"none", 0.0f, fe::AttentionImplementation_t::AUTO, "auto"},
      {"bias", 0.0f, fe::AttentionImplementation_t::AUTO, "auto"},
      {"padding", 0.0f, fe::AttentionImplementation_t::AUTO, "auto"},
      {"keybias", 0.0f, fe::AttentionImplementation_t::AUTO, "auto"},
      {"bias", 0.1f, fe::AttentionImplementation_t::AUTO, "auto"},
      {"keybias", 0.1f, fe::AttentionImplementation_t::AUTO, "auto"},
      {"padding", 0.1f, fe::AttentionImplementation_t::AUTO, "auto"},
      {"bias", 0.1f, fe::AttentionImplementation_t::COMPOSITE, "composite"},
      {"bias", 0.1f, fe::AttentionImplementation_t::UNIFIED, "unified"},
      {"padding", 0.1f, fe::AttentionImplementation_t::UNIFIED, "unified"},
  };
  for (const Case& c : cases)
    for (const Variant& v : variants) run_case(c, v, handle, stream);
  cudnnDestroy(handle);
  return 0;
}
