// BERT with Hugging Face's module tree and names (bert.h).
#include "kiln/layers/models/bert.h"
#include "kiln/layers/autocast_ops.h"

#include <optional>
#include <string>

#include "kiln/autograd/autocast.h"      // autocast::target_dtype: the stacked projection's dtype
#include "kiln/autograd/checkpoint.h"    // autograd::checkpoint (gradient checkpointing)
#include "kiln/autograd/grad_mode.h"     // NoGradGuard for initialisation
#include "kiln/autograd/stacked_cast.h"  // autocast::stacked_cast: its parameters, cast as one stack
#include "kiln/layers/attention.h"       // nn::scaled_dot_product_attention
#include "kiln/layers/fp8_linear.h"      // nn::fp8_linear: the stacked q/k/v product in FP8 regions
#include "kiln/layers/functional.h"      // nn::linear
#include "kiln/layers/init.h"            // normal_, zeros_, ones_
#include "kiln/layers/loss.h"            // cross_entropy, mse_loss
#include "kiln/tensor/checked_size.h"    // checked_mul, mul_overflows: sizes from a config
#include "kiln/tensor/error.h"           // KILN_CHECK
#include "kiln/tensor/internal_ops.h"    // internal::arange: the first row of each sequence
#include "kiln/tensor/trace.h"           // trace::Scope: the module ranges of calls that bypass a handle

namespace kiln::nn::models {
namespace {

Tensor activate(const Tensor& x, BertActivation act) {
  switch (act) {
    case BertActivation::Gelu: return gelu(x);
    case BertActivation::GeluTanh: return gelu(x, /*tanh_approximation=*/true);
    case BertActivation::Relu: return relu(x);
  }
  return x;
}

void check_ids(const char* what, const Tensor& ids, const char* name) {
  KILN_CHECK(ids.defined(), what, ": ", name, " is undefined; pass (N, S) integer token ids");
  KILN_CHECK(ids.dim() == 2 && is_integral(ids.dtype()), what, ": expected ", name,
             " of shape (N, S) with an integer dtype (Int64), got shape ", ids.shape(), " and dtype ", ids.dtype());
}

}  // namespace

// ---------------------------------------------------------------- config

void BertConfig::validate() const {
  KILN_CHECK(vocab_size > 0 && hidden_size > 0 && num_hidden_layers > 0 && num_attention_heads > 0 &&
                 intermediate_size > 0 && max_position_embeddings > 0 && type_vocab_size > 0,
             "BertConfig: every size must be positive, got vocab_size ", vocab_size, ", hidden_size ", hidden_size,
             ", num_hidden_layers ", num_hidden_layers, ", num_attention_heads ", num_attention_heads,
             ", intermediate_size ", intermediate_size, ", max_position_embeddings ", max_position_embeddings,
             ", type_vocab_size ", type_vocab_size);
  KILN_CHECK(hidden_size % num_attention_heads == 0, "BertConfig: hidden_size (", hidden_size,
             ") must be divisible by num_attention_heads (", num_attention_heads, ")");
  KILN_CHECK(hidden_dropout_prob >= 0 && hidden_dropout_prob < 1 && attention_probs_dropout_prob >= 0 &&
                 attention_probs_dropout_prob < 1,
             "BertConfig: dropout probabilities must lie in [0, 1), got hidden_dropout_prob ", hidden_dropout_prob,
             " and attention_probs_dropout_prob ", attention_probs_dropout_prob);
  KILN_CHECK(pad_token_id >= 0 && pad_token_id < vocab_size, "BertConfig: pad_token_id ", pad_token_id,
             " must lie in [0, vocab_size = ", vocab_size, ")");
  // Every weight's element and byte count (float32) must fit in int64; the largest are the embedding tables
  // (e.g. max_position_embeddings x hidden_size) and the feed-forward weights.
  for (auto [rows, name] : {std::pair<int64_t, const char*>{vocab_size, "vocab_size"},
                            {max_position_embeddings, "max_position_embeddings"},
                            {type_vocab_size, "type_vocab_size"},
                            {intermediate_size, "intermediate_size"}}) {
    int64_t n = 0, bytes = 0;
    KILN_CHECK(!mul_overflows(rows, hidden_size, &n) && !mul_overflows(n, 4, &bytes), "BertConfig: ", name, " (", rows,
               ") x hidden_size (", hidden_size,
               ") elements of float32 exceed 2^63-1 bytes; use sizes a model can hold (BERT-base: vocab_size 30522, "
               "max_position_embeddings 512, hidden_size 768)");
  }
  (void)num_parameters(true);
}

int64_t BertConfig::num_parameters(bool with_pooler) const {
  // Checked: sizes come from the command line or a config.json (DESIGN.md rule 11).
  constexpr std::string_view kWhat = "BertConfig: the parameter count";
  auto mul = [&](int64_t a, int64_t b) { return checked_mul(a, b, kWhat); };
  auto add = [&](int64_t a, int64_t b) { return checked_add(a, b, kWhat); };
  const int64_t H = hidden_size, I = intermediate_size;
  const int64_t rows = add(add(vocab_size, max_position_embeddings), type_vocab_size);
  const int64_t embeddings = add(mul(rows, H), mul(2, H));                                 // + LayerNorm
  const int64_t attention = add(mul(4, add(mul(H, H), H)), mul(2, H));                     // q, k, v, out + LayerNorm
  const int64_t feed_forward = add(add(add(mul(H, I), I), add(mul(I, H), H)), mul(2, H));  // two dense + LayerNorm
  const int64_t pooler = with_pooler ? add(mul(H, H), H) : 0;
  return add(add(embeddings, mul(num_hidden_layers, add(attention, feed_forward))), pooler);
}

void bert_init_weights(Module& root, const BertConfig& config, Generator* gen) {
  // Hugging Face's BertPreTrainedModel._init_weights.
  for (const ModulePtr& m : root.modules()) {
    if (auto* fc = dynamic_cast<Linear*>(m.get())) {
      init::normal_(fc->weight, 0, config.initializer_range, gen);
      if (fc->bias.defined()) init::zeros_(fc->bias);
    } else if (auto* emb = dynamic_cast<Embedding*>(m.get())) {
      init::normal_(emb->weight, 0, config.initializer_range, gen);
      if (emb->padding_idx) {
        NoGradGuard no_grad;
        Tensor row = emb->weight.select(0, *emb->padding_idx);
        row.zero_();
      }
    } else if (auto* ln = dynamic_cast<LayerNorm*>(m.get())) {
      if (ln->weight.defined()) init::ones_(ln->weight);
      if (ln->bias.defined()) init::zeros_(ln->bias);
    }
  }
}

// ---------------------------------------------------------------- embeddings

BertEmbeddings::BertEmbeddings(const BertConfig& c) : Module("BertEmbeddings") {
  word_embeddings = register_module(
      "word_embeddings", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, EmbeddingOptions{c.pad_token_id}));
  position_embeddings =
      register_module("position_embeddings", std::make_shared<Embedding>(c.max_position_embeddings, c.hidden_size));
  token_type_embeddings =
      register_module("token_type_embeddings", std::make_shared<Embedding>(c.type_vocab_size, c.hidden_size));
  layer_norm = register_module(
      "LayerNorm", std::make_shared<nn::LayerNorm>(Shape{c.hidden_size}, LayerNormOptions{.eps = c.layer_norm_eps}));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.hidden_dropout_prob));
}

Tensor BertEmbeddings::forward(const Tensor& input_ids, const Tensor& token_type_ids) {
  check_ids("BertEmbeddings", input_ids, "input_ids");
  const int64_t N = input_ids.size(0), S = input_ids.size(1);
  KILN_CHECK(S <= position_embeddings->num_embeddings, "BertEmbeddings: sequence length ", S,
             " exceeds max_position_embeddings = ", position_embeddings->num_embeddings,
             "; truncate the input or build the model with a larger max_position_embeddings");
  Tensor types = token_type_ids;
  if (types.defined()) {
    check_ids("BertEmbeddings", types, "token_type_ids");
    KILN_CHECK(types.shape() == input_ids.shape(), "BertEmbeddings: token_type_ids has shape ", types.shape(),
               " but input_ids has shape ", input_ids.shape(), "; they must match");
  } else {
    types = zeros({N, S}, {.dtype = DType::Int64, .device = input_ids.device()});
  }
  Tensor positions = arange(S, {.dtype = DType::Int64, .device = input_ids.device()});  // (S)
  // (N, S, H) + (S, H) + (N, S, H)
  Tensor x = word_embeddings(input_ids) + position_embeddings(positions) + token_type_embeddings(types);
  return dropout(layer_norm(x));
}

// ---------------------------------------------------------------- one encoder layer

BertSelfAttention::BertSelfAttention(const BertConfig& c)
    : Module("BertSelfAttention"),
      num_heads(c.num_attention_heads),
      head_dim(c.hidden_size / c.num_attention_heads),
      attention_dropout(c.attention_probs_dropout_prob) {
  query = register_module("query", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
  key = register_module("key", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
  value = register_module("value", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
}

Tensor BertSelfAttention::forward(const Tensor& hidden, const Tensor& mask) {
  const int64_t N = hidden.size(0), S = hidden.size(1), H = hidden.size(2);
  // (N, S, H) -> (N, S, heads, D) -> (N, heads, S, D)
  auto heads = [&](const Tensor& x) { return permute(reshape(x, {N, S, num_heads, head_dim}), {0, 2, 1, 3}); };
  // The three projections as one product with the weights stacked: stacked_projection, or in an FP8 region where the
  // recipe selects all three, stacked_fp8_projection. Where it selects only some, each is its own nn::Linear call.
  std::vector<Tensor> qkv;
  if (const amp::Fp8Recipe* recipe = autocast::fp8_recipe(hidden.device().type());
      recipe != nullptr && hidden.is_floating_point()) {
    amp::Fp8ScalingState* state = query->fp8_state_for(*recipe, hidden.device());
    const bool all = state != nullptr && key->fp8_state_for(*recipe, hidden.device()) != nullptr &&
                     value->fp8_state_for(*recipe, hidden.device()) != nullptr;
    const int biases = int(query->bias.defined()) + int(key->bias.defined()) + int(value->bias.defined());
    if (all && (biases == 0 || biases == 3)) {
      qkv = stacked_fp8_projection(hidden, *state);
    } else {
      qkv = {query(hidden), key(hidden), value(hidden)};
    }
  } else {
    qkv = stacked_projection(hidden);
  }
  Tensor context =
      scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]),
                                   {.attn_mask = mask, .dropout_p = is_training() ? attention_dropout : 0.0});
  return reshape(permute(context, {0, 2, 1, 3}), {N, S, H});  // (N, heads, S, D) -> (N, S, H)
}

std::vector<Tensor> BertSelfAttention::stacked_projection(const Tensor& hidden) {
  // One read of `hidden`, one cast of it under autocast, one larger GEMM; the parameters stay query, key and value,
  // as in Hugging Face's checkpoints. Under autocast the three weights (and the three biases) are cast as one stack
  // (autocast::stacked_cast): once the optimizer has written their 16-bit shadows, which it keeps as the rows of one
  // buffer, the stack is that buffer and nothing is copied, and the stack's float32 gradient comes back as three
  // tensors that .grad keeps as they are.
  const int64_t H = hidden.size(2);
  const std::vector<Tensor> weights{query->weight, key->weight, value->weight};
  const std::optional<DType> low = autocast::target_dtype(autocast_ops::linear(), hidden.device(), DType::Float32);
  const auto stack = [&](const std::vector<Tensor>& ps) { return low ? autocast::stacked_cast(ps, *low) : cat(ps, 0); };
  const Tensor w = stack(weights);  // (3H, H)
  Tensor b;
  if (query->bias.defined() && key->bias.defined() && value->bias.defined()) {
    b = stack({query->bias, key->bias, value->bias});  // (3H)
  }
  return split(linear(hidden, w, b), H, -1);  // 3 x (N, S, H), views
}

std::vector<Tensor> BertSelfAttention::stacked_fp8_projection(const Tensor& hidden, amp::Fp8ScalingState& state) {
  // One FP8 product for the three: `hidden` quantised once, one (3H, H) weight, and in backward one quantisation of
  // the output gradient and one dX product (no sum of three). One scale per operand covers the stack, so the three
  // Linears share query's state (key's and value's fp8_* buffers then hold the same values as query's, as a
  // checkpoint saves them). The float32 master weights are quantised into the stack directly (nothing copies them),
  // and the weights' gradients come from one product of the stack (each then copied out as its own .grad).
  const int64_t H = hidden.size(2);
  key->share_fp8_state(*query);
  value->share_fp8_state(*query);
  const std::vector<Tensor> biases =
      query->bias.defined() ? std::vector<Tensor>{query->bias, key->bias, value->bias} : std::vector<Tensor>{};
  const Tensor y = fp8_linear_stacked(hidden, {query->weight, key->weight, value->weight}, biases, state,
                                      autocast::get_dtype(hidden.device().type()));
  return split(y, H, -1);  // 3 x (N, S, H), views
}

BertResidualOutput::BertResidualOutput(const BertConfig& c, int64_t in_features) : Module("BertOutput") {
  dense = register_module("dense", std::make_shared<Linear>(in_features, c.hidden_size));
  layer_norm = register_module(
      "LayerNorm", std::make_shared<nn::LayerNorm>(Shape{c.hidden_size}, LayerNormOptions{.eps = c.layer_norm_eps}));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.hidden_dropout_prob));
}

Tensor BertResidualOutput::forward(const Tensor& x, const Tensor& residual) { return add_and_norm(dense(x), residual); }

Tensor BertResidualOutput::forward_mlp(Linear& fc1, const Tensor& x, bool tanh_approximation, const Tensor& residual) {
  trace::Scope range(trace::Kind::Module, type_name(), x.device(), {}, this);  // as a call through a handle
  return add_and_norm(linear_gelu_linear(fc1, *dense, x, tanh_approximation), residual);
}

Tensor BertResidualOutput::add_and_norm(const Tensor& projected, const Tensor& residual) {
  // dropout -> + residual -> LayerNorm as one op (one kernel each way on the GPU); the dropout module keeps its name
  // and its p, and its train()/eval() state decides whether elements are dropped.
  amp::Fp8ScalingState* next = nullptr;
  if (const amp::Fp8Recipe* recipe = autocast::fp8_recipe(projected.device().type());
      recipe != nullptr && fp8_next != nullptr) {
    next = fp8_next->fp8_state_for(*recipe, projected.device());
  }
  return dropout_add_layer_norm(projected, residual, dropout->options.p, dropout->is_training(),
                                layer_norm->normalized_shape, layer_norm->weight, layer_norm->bias,
                                layer_norm->options.eps, nullptr, next);
}

BertAttention::BertAttention(const BertConfig& c) : Module("BertAttention") {
  self = register_module("self", std::make_shared<BertSelfAttention>(c));
  output = register_module("output", std::make_shared<BertResidualOutput>(c, c.hidden_size));
}

Tensor BertAttention::forward(const Tensor& hidden, const Tensor& mask) { return output(self(hidden, mask), hidden); }

BertIntermediate::BertIntermediate(const BertConfig& c) : Module("BertIntermediate"), act(c.hidden_act) {
  dense = register_module("dense", std::make_shared<Linear>(c.hidden_size, c.intermediate_size));
}

Tensor BertIntermediate::forward(const Tensor& x) { return activate(dense(x), act); }

BertLayer::BertLayer(const BertConfig& c) : Module("BertLayer") {
  attention = register_module("attention", std::make_shared<BertAttention>(c));
  intermediate = register_module("intermediate", std::make_shared<BertIntermediate>(c));
  output = register_module("output", std::make_shared<BertResidualOutput>(c, c.intermediate_size));
  attention->output->fp8_next = intermediate->dense.get();
}

Tensor BertLayer::forward(const Tensor& hidden, const Tensor& mask) {
  Tensor a = attention(hidden, mask);
  // A GELU goes with the two products around it (BertResidualOutput::forward_mlp, linear_gelu_linear): in an FP8
  // region the activation is never written, forward or backward; elsewhere the MLP is one autograd node whose backward
  // sums the first bias's gradient in the GELU's pass (nn::linear_gelu_linear). The intermediate's product then runs
  // inside the output's profiler range. The same values as output(intermediate(a), a).
  const bool gelu = intermediate->act == BertActivation::Gelu || intermediate->act == BertActivation::GeluTanh;
  if (gelu) return output->forward_mlp(*intermediate->dense, a, intermediate->act == BertActivation::GeluTanh, a);
  return output(intermediate(a), a);
}

BertEncoder::BertEncoder(const BertConfig& c) : Module("BertEncoder") {
  layer = register_module("layer", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layer->push_back(std::make_shared<BertLayer>(c));
}

Tensor BertEncoder::forward(const Tensor& hidden, const Tensor& mask) {
  Tensor h = hidden;
  const bool recompute = gradient_checkpointing && GradMode::is_enabled();
  for (int64_t i = 0; i < layer->size(); ++i) {
    auto block = layer->at<BertLayer>(i);
    // A layer's output goes to the next layer's query (its FP8 codes made in the layer norm's pass), except across
    // checkpointed layers, where the next layer receives the checkpoint's own output.
    block->output->fp8_next =
        !recompute && i + 1 < layer->size() ? layer->at<BertLayer>(i + 1)->attention->self->query.get() : nullptr;
    if (recompute) {
      // The mask is captured by value: the recomputation runs during backward, after this call has returned.
      h = autograd::checkpoint([block, mask](const Tensor& in) { return block(in, mask); }, h);
    } else {
      h = block(h, mask);
    }
  }
  return h;
}

BertPooler::BertPooler(const BertConfig& c) : Module("BertPooler") {
  dense = register_module("dense", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
}

Tensor BertPooler::forward(const Tensor& hidden) {
  return kiln::tanh(dense(select(hidden, 1, 0)));  // (N, S, H) -> [CLS] (N, H)
}

// ---------------------------------------------------------------- BertModel

BertModel::BertModel(const BertConfig& c, bool add_pooling_layer) : Module("BertModel"), config(c) {
  config.validate();
  embeddings = register_module("embeddings", std::make_shared<BertEmbeddings>(c));
  encoder = register_module("encoder", std::make_shared<BertEncoder>(c));
  if (add_pooling_layer) pooler = register_module("pooler", std::make_shared<BertPooler>(c));
  bert_init_weights(*this, config);
}

BertModel::Output BertModel::forward(const Tensor& input_ids, const Tensor& token_type_ids,
                                     const Tensor& attention_mask) {
  check_ids("BertModel", input_ids, "input_ids");
  Tensor mask;  // (N, 1, 1, S) Bool, true = may attend: every query sees every real token.
  if (attention_mask.defined()) {
    KILN_CHECK(attention_mask.shape() == input_ids.shape(), "BertModel: attention_mask has shape ",
               attention_mask.shape(), " but input_ids has shape ", input_ids.shape(),
               "; give (N, S) with 1 for tokens and 0 for padding");
    KILN_CHECK(attention_mask.device() == input_ids.device(), "BertModel: attention_mask is on ",
               attention_mask.device(), " but input_ids on ", input_ids.device());
    Tensor m = attention_mask.dtype() == DType::Bool ? attention_mask : ne(attention_mask, 0);
    mask = reshape(m, {input_ids.size(0), 1, 1, input_ids.size(1)});
  }
  Output out;
  AttentionMaskScope one_mask;  // every layer's attention takes the same mask: prepared once for the GPU's kernels
  out.sequence_output = encoder(embeddings(input_ids, token_type_ids), mask);
  if (pooler) out.pooled_output = pooler(out.sequence_output);
  return out;
}

// ---------------------------------------------------------------- masked LM

BertLMPredictionHead::BertLMPredictionHead(const BertConfig& c, const Tensor& word_embedding_weight)
    : Module("BertLMPredictionHead"), act(c.hidden_act) {
  KILN_CHECK(word_embedding_weight.defined() && word_embedding_weight.shape() == (Shape{c.vocab_size, c.hidden_size}),
             "BertLMPredictionHead: the tied word-embedding weight must have shape (vocab_size, hidden_size) = ",
             Shape{c.vocab_size, c.hidden_size});
  // HF registers the bias before the children, so "cls.predictions.bias" is listed first.
  bias = register_parameter("bias", zeros({c.vocab_size}));
  transform = register_module("transform", std::make_shared<Module>("BertPredictionHeadTransform"));
  transform_dense = transform->register_module("dense", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
  transform_layer_norm = transform->register_module(
      "LayerNorm", std::make_shared<nn::LayerNorm>(Shape{c.hidden_size}, LayerNormOptions{.eps = c.layer_norm_eps}));
  // The decoder holds the very same tensors: one parameter, listed once by named_parameters() (under its
  // first name), present under both names in state_dict(), its gradient accumulated from both uses.
  decoder = register_module("decoder", std::make_shared<Module>("Linear"));
  decoder_weight = decoder->register_parameter("weight", word_embedding_weight);
  decoder->register_parameter("bias", bias);
}

Tensor BertLMPredictionHead::forward(const Tensor& hidden) {
  Tensor h = transform_layer_norm(activate(transform_dense(hidden), act));  // (N, S, H)
  return linear(h, decoder_weight, bias);                                   // (N, S, vocab)
}

BertForMaskedLM::BertForMaskedLM(const BertConfig& c) : Module("BertForMaskedLM") {
  bert = register_module("bert", std::make_shared<BertModel>(c, /*add_pooling_layer=*/false));
  cls = register_module("cls", std::make_shared<Module>("BertOnlyMLMHead"));
  predictions = cls->register_module(
      "predictions", std::make_shared<BertLMPredictionHead>(c, bert->embeddings->word_embeddings->weight));
  bert_init_weights(*predictions->transform, c);
}

BertForMaskedLM::Output BertForMaskedLM::forward(const Tensor& input_ids, const Tensor& token_type_ids,
                                                 const Tensor& attention_mask, const Tensor& labels,
                                                 const Tensor& masked_positions) {
  if (labels.defined()) {
    KILN_CHECK(labels.shape() == input_ids.shape() && is_integral(labels.dtype()),
               "BertForMaskedLM: labels must be integer token ids of the input's shape ", input_ids.shape(),
               " (-100 where nothing is predicted), got shape ", labels.shape(), " and dtype ", labels.dtype());
  }
  Tensor rows, targets;  // the listed positions as rows of the (N * S, H) sequence output (N * P), and their labels
  if (masked_positions.defined()) {
    const Tensor& p = masked_positions;
    KILN_CHECK(p.dim() == 2 && p.size(0) == input_ids.size(0) && p.size(1) > 0 && p.dtype() == DType::Int64,
               "BertForMaskedLM: masked_positions must be Int64 of shape (N, P) with N = ", input_ids.size(0),
               " (the batch) and P >= 1, got ", p.dtype(), " of shape ", p.shape());
    KILN_CHECK(p.device() == input_ids.device(), "BertForMaskedLM: masked_positions is on ", p.device(),
               " but input_ids on ", input_ids.device());
    const int64_t N = input_ids.size(0), S = input_ids.size(1);
    if (!p.is_cuda()) {  // on the GPU this would wait for it: index_select reports it instead
      const double lo = amin(p).item<double>(), hi = amax(p).item<double>();
      KILN_CHECK(lo >= 0 && hi < static_cast<double>(S), "BertForMaskedLM: masked_positions must be in [0, ", S,
                 ") (the sequence length), got values from ", lo, " to ", hi);
    }
    // Position j of sequence i is row i * S + j. A position outside [0, S) becomes row N * S, past every row, so
    // that index_select reports it instead of reading another sequence's row.
    const Tensor first = internal::arange(0, N * S, S, {.dtype = DType::Int64, .device = p.device()});
    rows = reshape((p + unsqueeze(first, 1)).masked_fill(lt(p, 0) | ge(p, S), N * S), {-1});
    if (labels.defined()) targets = reshape(labels, {-1}).index_select(0, rows);
  }
  Output out;
  Tensor hidden = bert(input_ids, token_type_ids, attention_mask).sequence_output;  // (N, S, H)
  if (rows.defined()) {
    hidden = reshape(reshape(hidden, {-1, hidden.size(-1)}).index_select(0, rows),
                     {masked_positions.size(0), masked_positions.size(1), hidden.size(-1)});
  }
  out.logits = predictions(hidden);
  if (labels.defined()) {
    const int64_t V = out.logits.size(-1);
    out.loss = cross_entropy(reshape(out.logits, {-1, V}), rows.defined() ? targets : reshape(labels, {-1}),
                             {.ignore_index = -100});
  }
  return out;
}

// ---------------------------------------------------------------- sequence classification

BertForSequenceClassification::BertForSequenceClassification(const BertConfig& c, int64_t num_labels)
    : Module("BertForSequenceClassification"), num_labels(num_labels) {
  KILN_CHECK(num_labels > 0, "BertForSequenceClassification: num_labels must be positive, got ", num_labels);
  bert = register_module("bert", std::make_shared<BertModel>(c));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.hidden_dropout_prob));
  classifier = register_module("classifier", std::make_shared<Linear>(c.hidden_size, num_labels));
  bert_init_weights(*classifier, c);
}

BertForSequenceClassification::Output BertForSequenceClassification::forward(const Tensor& input_ids,
                                                                             const Tensor& token_type_ids,
                                                                             const Tensor& attention_mask,
                                                                             const Tensor& labels) {
  Output out;
  out.logits = classifier(dropout(bert(input_ids, token_type_ids, attention_mask).pooled_output));
  if (labels.defined()) {
    if (num_labels == 1) {
      // Regression, as Hugging Face: MSE against float targets (N).
      out.loss = mse_loss(reshape(out.logits, {-1}), cast(reshape(labels, {-1}), out.logits.dtype()));
    } else {
      KILN_CHECK(is_integral(labels.dtype()) && labels.dim() == 1 && labels.size(0) == input_ids.size(0),
                 "BertForSequenceClassification: labels must be class indices of shape (N) = (", input_ids.size(0),
                 ") with an integer dtype, got shape ", labels.shape(), " and dtype ", labels.dtype());
      out.loss = cross_entropy(out.logits, labels);
    }
  }
  return out;
}

}  // namespace kiln::nn::models
