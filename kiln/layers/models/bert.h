// kiln/layers/models/bert.h — BERT (Devlin et al. 2018) with Hugging Face's module tree and parameter names.
//
//   using namespace kiln;
//   auto mlm = nn::make<models::BertForMaskedLM>(models::BertConfig::base());   // an nn::Handle
//   auto out = mlm(input_ids, token_type_ids, attention_mask, labels);   // (N, S) Int64 each; its forward(...)
//   out.loss.backward();                                                 // out.logits (N, S, vocab)
//
//   models::BertConfig tiny{.vocab_size = 50, .hidden_size = 16, .num_hidden_layers = 2, .num_attention_heads = 2,
//                       .intermediate_size = 32, .max_position_embeddings = 16};   // any custom size
//   auto clf = nn::make<models::BertForSequenceClassification>(tiny, /*num_labels=*/3);
//
// Names match transformers' BertModel / BertForMaskedLM / BertForSequenceClassification
// ("bert.encoder.layer.0.attention.self.query.weight", "cls.predictions.transform.LayerNorm.weight", ...),
// so Hugging Face state dicts load by name. Initialisation as Hugging Face's _init_weights: Linear and
// Embedding weights N(0, initializer_range^2), biases zero, the padding row (id 0) of the word embeddings
// zero, LayerNorm ones and zeros. Self-attention goes through nn::scaled_dot_product_attention.
// The modules' forward functions take several inputs (ids, masks, residuals); they call one another through
// their handles (layer(hidden, mask)), so each call is a profiler range named after the module, as yours are
// when you call the model through a handle (mlm(ids, ...)) rather than mlm->forward(ids, ...). Those with several
// inputs make Module's one-tensor forward private (`using Module::forward;` in a private section): it is not
// hidden by accident (no -Woverloaded-virtual warning, which -Wall gives with GCC 13 and clang), and layer(h)
// does not compile.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/layers/containers.h"  // nn::ModuleList
#include "kiln/layers/layers.h"      // nn::Linear, nn::Embedding, nn::LayerNorm, nn::Dropout
#include "kiln/layers/module.h"      // nn::Module
#include "kiln/tensor/generator.h"   // Generator
#include "kiln/tensor/tensor.h"      // Tensor

namespace kiln::nn::models {

// The activation of the feed-forward block and the LM head's transform (BertConfig::hidden_act).
enum class BertActivation { Gelu, GeluTanh, Relu };  // HF's "gelu", "gelu_new", "relu"

// The defaults are bert-base-uncased's.
struct BertConfig {
  int64_t vocab_size = 30522;                        // rows of the word-embedding table (and the MLM logits)
  int64_t hidden_size = 768;                         // H; a multiple of num_attention_heads
  int64_t num_hidden_layers = 12;                    // encoder layers
  int64_t num_attention_heads = 12;                  // heads per self-attention
  int64_t intermediate_size = 3072;                  // I, the feed-forward block's inner size
  int64_t max_position_embeddings = 512;             // the longest sequence S the model accepts
  int64_t type_vocab_size = 2;                       // token types (segments)
  double hidden_dropout_prob = 0.1;                  // dropout on the embeddings and every residual branch
  double attention_probs_dropout_prob = 0.1;         // dropout on the attention weights (training only)
  double layer_norm_eps = 1e-12;                     // every LayerNorm's eps
  BertActivation hidden_act = BertActivation::Gelu;  // the feed-forward activation
  double initializer_range = 0.02;                   // standard deviation of the initial Linear and Embedding weights
  int64_t pad_token_id = 0;                          // the word-embedding row zeroed at initialisation (padding_idx)

  // bert-base: the defaults (H 768, 12 layers, 12 heads, I 3072).
  static BertConfig base() { return {}; }
  // bert-large: H 1024, 24 layers, 16 heads, I 4096; the other fields as base().
  static BertConfig large() {
    return {.hidden_size = 1024, .num_hidden_layers = 24, .num_attention_heads = 16, .intermediate_size = 4096};
  }
  // Any other size: the designated-initializer form above, or base() with fields changed.
  static BertConfig custom(int64_t vocab_size, int64_t hidden_size, int64_t num_hidden_layers,
                           int64_t num_attention_heads, int64_t intermediate_size, int64_t max_position_embeddings) {
    return {.vocab_size = vocab_size,
            .hidden_size = hidden_size,
            .num_hidden_layers = num_hidden_layers,
            .num_attention_heads = num_attention_heads,
            .intermediate_size = intermediate_size,
            .max_position_embeddings = max_position_embeddings};
  }
  // Throws kiln::Error naming the bad field (e.g. hidden_size not divisible by num_attention_heads).
  void validate() const;
  // Parameters of BertModel for this config, without building it (with_pooler: the pooler's dense layer).
  // base(): 109,482,240, as Hugging Face's bert-base-uncased.
  int64_t num_parameters(bool with_pooler = true) const;
};

// word + position + token_type embeddings -> LayerNorm -> dropout: (N, S) ids -> (N, S, H).
class BertEmbeddings : public Module {
  using Module::forward;  // private: the one-tensor forward does not apply (see above)

 public:
  explicit BertEmbeddings(const BertConfig& config);
  // token_type_ids undefined: all type 0. Positions are 0 .. S-1.
  Tensor forward(const Tensor& input_ids, const Tensor& token_type_ids);

  Handle<Embedding> word_embeddings;        // (vocab_size, H), its padding row pad_token_id
  Handle<Embedding> position_embeddings;    // (max_position_embeddings, H)
  Handle<Embedding> token_type_embeddings;  // (type_vocab_size, H)
  Handle<LayerNorm> layer_norm;             // registered as "LayerNorm", HF's name
  Handle<Dropout> dropout;                  // hidden_dropout_prob
};

// "attention.self": query, key, value (H -> H) and multi-head scaled dot-product attention.
class BertSelfAttention : public Module {
  using Module::forward;  // private: the one-tensor forward does not apply (see above)

 public:
  explicit BertSelfAttention(const BertConfig& config);
  // hidden (N, S, H), mask Bool broadcastable to (N, heads, S, S) (true = may attend) or undefined -> (N, S, H).
  Tensor forward(const Tensor& hidden, const Tensor& mask);

  // num_attention_heads.
  int64_t num_heads, head_dim;  // hidden_size / num_attention_heads
  double attention_dropout;     // attention_probs_dropout_prob, applied in training mode only
  Handle<Linear> query;         // H -> H
  Handle<Linear> key;           // H -> H
  Handle<Linear> value;         // H -> H

 private:
  // q, k, v as one product with the three weights stacked: 3 views (N, S, H).
  std::vector<Tensor> stacked_projection(const Tensor& hidden);
  // The same in an FP8 region, as one FP8 product under `state` (query's, which key and value then share).
  std::vector<Tensor> stacked_fp8_projection(const Tensor& hidden, amp::Fp8ScalingState& state);
};

// dense -> dropout -> LayerNorm(x + residual) (nn::dropout_add_layer_norm): "attention.output" (H -> H) and "output"
// (I -> H).
class BertResidualOutput : public Module {
  using Module::forward;  // private: the one-tensor forward does not apply (see above)

 public:
  BertResidualOutput(const BertConfig& config, int64_t in_features);
  // LayerNorm(dropout(dense(x)) + residual): x (N, S, in_features), residual (N, S, H) -> (N, S, H).
  Tensor forward(const Tensor& x, const Tensor& residual);
  // forward(gelu(fc1(x), tanh_approximation), residual), fc1 and dense through linear_gelu_linear: in an FP8 region
  // one function whose GELU is never written, forward or backward; elsewhere, in training, one autograd node whose
  // backward sums fc1's bias gradient in the GELU's pass (BertLayer takes this path for its GELU activations).
  Tensor forward_mlp(Linear& fc1, const Tensor& x, bool tanh_approximation, const Tensor& residual);

  Handle<Linear> dense;          // in_features -> H
  Handle<LayerNorm> layer_norm;  // "LayerNorm"
  Handle<Dropout> dropout;       // hidden_dropout_prob
  // The Linear that reads this block's output next (not owned; null: none): in an FP8 region where it computes in
  // FP8, the layer norm writes the output's FP8 codes for it in its own pass (dropout_add_layer_norm's fp8_next).
  // BertLayer and BertEncoder set it: the intermediate's dense for "attention.output", the next layer's query for
  // "output".
  Linear* fp8_next = nullptr;

 private:
  Tensor add_and_norm(const Tensor& projected, const Tensor& residual);  // LayerNorm(dropout(projected) + residual)
};

// Self-attention with its output projection, dropout, residual and layer norm ("attention").
class BertAttention : public Module {
  using Module::forward;  // private: the one-tensor forward does not apply (see above)

 public:
  explicit BertAttention(const BertConfig& config);
  // output(self(hidden, mask), hidden): (N, S, H) -> (N, S, H); mask as BertSelfAttention's.
  Tensor forward(const Tensor& hidden, const Tensor& mask);

  Handle<BertSelfAttention> self;     // "self"
  Handle<BertResidualOutput> output;  // "output": H -> H, with the residual `hidden`
};

// "intermediate": dense (H -> I) and the activation.
class BertIntermediate : public Module {
 public:
  explicit BertIntermediate(const BertConfig& config);  // dense H -> I, act = config.hidden_act
  Tensor forward(const Tensor& x) override;

  BertActivation act;    // config.hidden_act
  Handle<Linear> dense;  // H -> I
};

// One encoder layer: self-attention, then the feed-forward block, each with its residual and layer norm.
class BertLayer : public Module {
  using Module::forward;  // private: the one-tensor forward does not apply (see above)

 public:
  explicit BertLayer(const BertConfig& config);
  // (N, S, H) -> (N, S, H); mask as BertSelfAttention's.
  Tensor forward(const Tensor& hidden, const Tensor& mask);

  Handle<BertAttention> attention;        // "attention"
  Handle<BertIntermediate> intermediate;  // "intermediate": H -> I
  Handle<BertResidualOutput> output;      // "output": I -> H, with the attention's output as the residual
};

// dense + tanh on the first ([CLS]) token: (N, S, H) -> (N, H).
class BertPooler : public Module {
 public:
  explicit BertPooler(const BertConfig& config);  // dense H -> H
  Tensor forward(const Tensor& hidden) override;

  Handle<Linear> dense;  // H -> H
};

// "encoder": the stack of layers, under "layer.0", "layer.1", ...
class BertEncoder : public Module {
  using Module::forward;  // private: the one-tensor forward does not apply (see above)

 public:
  explicit BertEncoder(const BertConfig& config);
  // The layers in order: (N, S, H) -> (N, S, H); mask as BertSelfAttention's.
  Tensor forward(const Tensor& hidden, const Tensor& mask);

  Handle<ModuleList> layer;  // num_hidden_layers BertLayer modules
  // Gradient checkpointing: while gradients are recorded, each layer keeps only its input and recomputes its
  // activations during backward (autograd::checkpoint, with forward's dropout masks and autocast state): less
  // memory for about one more forward. Off by default; BertModel::set_gradient_checkpointing sets it.
  bool gradient_checkpointing = false;
};

// BERT's encoder (embeddings, layers, pooler) with Hugging Face's parameter names, so its checkpoints load.
class BertModel : public Module {
  using Module::forward;  // private: the one-tensor forward does not apply (see above)

 public:
  explicit BertModel(const BertConfig& config, bool add_pooling_layer = true);

  // What forward returns.
  struct Output {
    Tensor sequence_output{};  // (N, S, H)
    Tensor pooled_output{};    // (N, H); undefined without the pooling layer
  };
  // input_ids (N, S) integer; token_type_ids (N, S) integer or undefined (all 0); attention_mask (N, S)
  // 1 / true = token, 0 / false = padding (any dtype), or undefined (all tokens).
  Output forward(const Tensor& input_ids, const Tensor& token_type_ids, const Tensor& attention_mask);
  // Recompute each encoder layer during backward instead of keeping its activations (BertEncoder).
  void set_gradient_checkpointing(bool on = true) { encoder->gradient_checkpointing = on; }

  BertConfig config;                  // as constructed (validated)
  Handle<BertEmbeddings> embeddings;  // "embeddings"
  Handle<BertEncoder> encoder;        // "encoder"
  Handle<BertPooler> pooler;          // null without the pooling layer
};

// Hugging Face's _init_weights over every Linear, Embedding and LayerNorm under root (the constructors
// call it); draws from gen, or the default CPU generator.
void bert_init_weights(Module& root, const BertConfig& config, Generator* gen = nullptr);

// "cls.predictions": transform (dense H -> H, activation, LayerNorm), then the decoder H -> vocab whose
// weight is the word-embedding table itself (tied) and whose bias is "cls.predictions.bias".
class BertLMPredictionHead : public Module {
 public:
  // word_embedding_weight: the (vocab_size, H) table to tie the decoder to, else kiln::Error.
  BertLMPredictionHead(const BertConfig& config, const Tensor& word_embedding_weight);
  Tensor forward(const Tensor& hidden) override;  // (N, S, H) -> (N, S, vocab)

  BertActivation act;                      // config.hidden_act, in the transform
  Tensor bias;                             // (vocab), also registered as "decoder.bias"
  Handle<Module> transform;                // "transform", holding "dense" and "LayerNorm"
  Handle<Linear> transform_dense;          // "transform.dense": H -> H
  Handle<LayerNorm> transform_layer_norm;  // "transform.LayerNorm"
  Handle<Module> decoder;                  // holds "weight" (tied) and "bias"
  Tensor decoder_weight;                   // (vocab, H): the same Tensor as bert.embeddings.word_embeddings.weight
};

// BERT with the masked-language-model head (pretraining), as Hugging Face's BertForMaskedLM.
class BertForMaskedLM : public Module {
  using Module::forward;  // private: the one-tensor forward does not apply (see above)

 public:
  explicit BertForMaskedLM(const BertConfig& config);

  // What forward returns.
  struct Output {
    Tensor logits{};  // (N, S, vocab); (N, P, vocab) with masked_positions
    Tensor loss{};    // 0-d mean cross-entropy over labels != -100; undefined without labels
  };
  // labels (N, S) Int64: the token to predict, or -100 where nothing is predicted.
  // masked_positions (N, P) Int64, optional: the positions whose tokens are predicted, as Google's BERT and its
  // pretraining data name them (masked_lm_positions; data::MaskedLMOptions::max_predictions makes them). The head
  // (transform and the vocabulary-wide decoder) then runs on those N x P rows only, not on all N x S: about 15% of
  // its work at BERT's masking rate, with the same loss and gradients as long as every labelled position is listed
  // once. Entries past a sequence's predictions name a position whose label is -100 (the dataset pads with 0, the
  // [CLS] token, which is never predicted). The shapes stay fixed from batch to batch, so a CUDA graph can capture
  // the step. A labelled position that is not listed is not predicted.
  Output forward(const Tensor& input_ids, const Tensor& token_type_ids, const Tensor& attention_mask,
                 const Tensor& labels = {}, const Tensor& masked_positions = {});

  Handle<BertModel> bert;                    // without the pooler, as Hugging Face's
  Handle<Module> cls;                        // "cls", holding "predictions"
  Handle<BertLMPredictionHead> predictions;  // "cls.predictions"
};

// BERT with a classifier on the pooled output (fine-tuning), as Hugging Face's BertForSequenceClassification.
class BertForSequenceClassification : public Module {
  using Module::forward;  // private: the one-tensor forward does not apply (see above)

 public:
  BertForSequenceClassification(const BertConfig& config, int64_t num_labels = 2);

  // What forward returns.
  struct Output {
    Tensor logits{};  // (N, num_labels)
    Tensor loss{};    // cross-entropy (num_labels > 1, labels Int64 (N)) or MSE (num_labels == 1); or undefined
  };
  // Inputs as BertModel::forward's; labels (N) class indices, (N) values with num_labels == 1, or undefined (no
  // loss). The logits come from the pooled output, after dropout.
  Output forward(const Tensor& input_ids, const Tensor& token_type_ids, const Tensor& attention_mask,
                 const Tensor& labels = {});

  int64_t num_labels;         // the classifier's outputs; 1: regression
  Handle<BertModel> bert;     // with the pooler
  Handle<Dropout> dropout;    // hidden_dropout_prob, on the pooled output
  Handle<Linear> classifier;  // H -> num_labels
};

}  // namespace kiln::nn::models

namespace kiln {
namespace models = nn::models;  // kiln::models::BertModel, as resnet.h also declares
}  // namespace kiln
