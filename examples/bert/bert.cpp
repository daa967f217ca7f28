// examples/bert/bert.cpp — BERT masked-LM pretraining from raw text, and fine-tuning for sequence
// classification, written against kiln's public API only.
//
//   bert pretrain --text corpus/ --build-vocab 30522 --size base --seq-len 128 --out runs/pre
//   bert finetune --train train.tsv --eval dev.tsv --init-from runs/pre --out runs/cls
//   bert finetune --train train.tsv --eval dev.tsv --init-from bert-base-uncased/     (Hugging Face weights)
//   mpirun -np 8 bert pretrain ...                                                     (one process per GPU)
//   bert finetune ... --export-onnx cls.onnx          (at the end: the classifier for ONNX Runtime / TensorRT)
//
// The same program runs on one GPU, on the CPU (--device cpu, or no GPU) and under mpirun (data-parallel, one
// process per GPU). `bert MODE --help` lists the options. What the two modes share — options, setup, the
// training loop with accumulation, checkpoints and exact resume — is in bert_train.h; the input formats are in
// bert_data.h. README.md has the recipes.
#include <kiln/kiln.h>  // models::Bert*, data::MaskedLMDataset, WordPieceTokenizer, io::*, dist::*, optim::*

#include <algorithm>   // std::find
#include <cstdio>      // std::printf, std::fflush
#include <cstdlib>     // std::_Exit
#include <functional>  // std::function
#include <iostream>    // std::cout, std::cerr
#include <map>
#include <memory>
#include <optional>
#include <sstream>  // std::ostringstream
#include <string>
#include <vector>

#include "bert_data.h"   // text_files, ClassificationDataset, RankShard, config.json
#include "bert_train.h"  // RunOptions, start_runtime, Task, run_training

namespace bert_example {
namespace {

using kiln::autograd::TensorList;

// ---------------------------------------------------------------- model sizes

// base and large are the published BERT sizes; tiny is Google's BERT-Tiny (L=2, H=128), for trying things out
// on a CPU; custom takes --layers --hidden --heads --intermediate. Those four also override a preset's values.
models::BertConfig config_for(const ex::Options& opts, const std::string& size, int64_t layers, int64_t hidden,
                              int64_t heads, int64_t intermediate, int64_t max_positions, int64_t vocab_size) {
  models::BertConfig c;
  if (size == "base") {
    c = models::BertConfig::base();
  } else if (size == "large") {
    c = models::BertConfig::large();
  } else if (size == "tiny") {
    c = {.hidden_size = 128, .num_hidden_layers = 2, .num_attention_heads = 2, .intermediate_size = 512};
  } else if (size == "custom") {
    if (layers <= 0 || hidden <= 0 || heads <= 0 || intermediate <= 0) {
      opts.fail("--size custom needs --layers, --hidden, --heads and --intermediate (positive)");
    }
  } else {
    opts.fail("--size takes base, large, tiny or custom, not '" + size + "'");
  }
  if (layers > 0) c.num_hidden_layers = layers;
  if (hidden > 0) c.hidden_size = hidden;
  if (heads > 0) c.num_attention_heads = heads;
  if (intermediate > 0) c.intermediate_size = intermediate;
  c.max_position_embeddings = max_positions;
  c.vocab_size = vocab_size;
  try {
    c.validate();
  } catch (const kiln::Error& e) {
    opts.fail(std::string("the model size is not valid: ") + e.what());
  }
  return c;
}

void describe_config(io::Metadata& meta, const models::BertConfig& c) {
  meta.numbers["vocab_size"] = static_cast<double>(c.vocab_size);
  meta.numbers["hidden_size"] = static_cast<double>(c.hidden_size);
  meta.numbers["num_hidden_layers"] = static_cast<double>(c.num_hidden_layers);
  meta.numbers["num_attention_heads"] = static_cast<double>(c.num_attention_heads);
  meta.numbers["intermediate_size"] = static_cast<double>(c.intermediate_size);
  meta.numbers["max_position_embeddings"] = static_cast<double>(c.max_position_embeddings);
  meta.strings["hidden_act"] = activation_name(c.hidden_act);
}

std::string shape_of(const models::BertConfig& c) {
  return std::to_string(c.num_hidden_layers) + " layers, hidden " + std::to_string(c.hidden_size) + ", " +
         std::to_string(c.num_attention_heads) + " heads, intermediate " + std::to_string(c.intermediate_size) +
         ", vocab " + std::to_string(c.vocab_size) + ", " + std::to_string(c.max_position_embeddings) + " positions";
}

// ---------------------------------------------------------------- forward passes

// The losses. With --checkpointing the models' encoders recompute each layer during backward
// (BertModel::set_gradient_checkpointing, set where the models are made): only a layer's input is kept.
// The masked-LM loss: mean cross-entropy over the positions whose label is not -100.
// With --max-predictions the batch lists the predicted positions, and the head runs on those rows only.
Tensor mlm_loss(const nn::Handle<models::BertForMaskedLM>& mlm, const data::Batch& b) {
  const Tensor positions = b.contains("masked_positions") ? b["masked_positions"] : Tensor{};
  return mlm(b["input_ids"], b["token_type_ids"], b["attention_mask"], b["labels"], positions).loss;
}

Tensor classification_loss(const nn::Handle<models::BertForSequenceClassification>& clf, const data::Batch& b) {
  return clf(b["input_ids"], b["token_type_ids"], b["attention_mask"], b["labels"]).loss;
}

// ---------------------------------------------------------------- the output folder

// A fresh run must not mix its checkpoints with another's; checked before anything is written into --out.
void check_out_folder(const RunOptions& o) {
  if (!fs::exists(o.out) || o.resume) return;
  if (auto latest = io::CheckpointManager(o.out).latest()) {
    throw std::runtime_error(o.out + " already holds checkpoints (" + *latest +
                             "); add --resume to continue that run, or choose another --out");
  }
}

bool has_checkpoint(const RunOptions& o) { return fs::exists(o.out) && io::CheckpointManager(o.out).latest(); }

// config.json, tokenizer_config.json and vocab.txt: with model.safetensors at the end, --out is a folder that
// `bert finetune --init-from` and Hugging Face's from_pretrained both read.
void write_model_folder(const RunOptions& o, const models::BertConfig& c, const std::string& architecture,
                        const data::WordPieceTokenizer& tok, const std::vector<std::string>& labels = {}) {
  fs::create_directories(o.out);
  write_bert_config(fs::path(o.out) / "config.json", c, architecture, labels);
  write_tokenizer_config(fs::path(o.out) / "tokenizer_config.json", tok.options().lower_case);
  tok.save_vocab(fs::path(o.out) / "vocab.txt");
}

void save_weights(const RunOptions& o, const nn::Module& model) {
  const fs::path p = fs::path(o.out) / "model.safetensors";
  io::save_safetensors(p.string(), model.state_dict(), {{"format", "pt"}});
  std::cout << "weights: " << p.string() << "\n";
}

// ---------------------------------------------------------------- ONNX export

// --export-onnx FILE, an option of both modes; `output` says what "logits" holds.
std::string& add_export_option(ex::Options& opts, const std::string& output) {
  return opts.add_string("export-onnx", "",
                         "after training, write the model to FILE as ONNX (opset 17) for ONNX Runtime or TensorRT: "
                         "inputs \"input_ids\", \"token_type_ids\", \"attention_mask\" (N, S) int64 of any N and S "
                         "up to the model's positions, output \"logits\" " +
                             output);
}

// Its folder must exist: checked before the run rather than found out after the training.
void check_export_path(const ex::Options& opts, const std::string& path) {
  const fs::path folder = fs::path(path).parent_path();
  if (!path.empty() && !folder.empty() && !fs::is_directory(folder)) {
    opts.fail("--export-onnx " + path + ": the folder " + folder.string() + " does not exist");
  }
}

// The trained model as ONNX, traced in eval mode (dropout off) on one sequence of seq_len tokens on the model's
// device, outside every autocast region: float32 throughout. `logits` calls the model on (input_ids,
// token_type_ids, attention_mask).
void export_model(const std::string& path, nn::Module& model,
                  const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& logits, int64_t seq_len,
                  Device device) {
  model.eval();  // (export_onnx would trace in eval mode anyway, with a warning)
  const kiln::TensorOptions i64{.dtype = DType::Int64, .device = device};
  const std::vector<Tensor> example = {kiln::ones({1, seq_len}, i64), kiln::zeros({1, seq_len}, i64),
                                       kiln::ones({1, seq_len}, i64)};  // (1, S) each: ids, types, mask
  const std::map<int64_t, std::string> varying = {{0, "batch"}, {1, "sequence"}};
  const io::OnnxExportReport r = io::export_onnx(
      model, [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{logits(in[0], in[1], in[2])}; }, example,
      path,
      {.input_names = {"input_ids", "token_type_ids", "attention_mask"},
       .output_names = {"logits"},
       .dynamic_axes = {{"input_ids", varying}, {"token_type_ids", varying}, {"attention_mask", varying}}});
  std::cout << "exported " << path << ": " << r.nodes << " ONNX nodes, " << r.bytes
            << " bytes; run it with ONNX Runtime or trtexec --onnx=" << path << "\n";
}

// ---------------------------------------------------------------- where initial weights come from

// --init-from: a folder with config.json and vocab.txt, and weights (model.safetensors, pytorch_model.bin, or
// the newest ckpt-*.h5 of a run of this example); or one weights or checkpoint file inside such a folder.
struct InitSource {
  fs::path folder, weights;
  bool kiln_checkpoint = false;
};

InitSource find_init(const std::string& arg) {
  const fs::path p(arg);
  if (!fs::exists(p)) throw std::runtime_error("--init-from " + arg + " does not exist");
  InitSource s;
  if (fs::is_directory(p)) {
    s.folder = p;
    for (const char* name : {"model.safetensors", "pytorch_model.bin"}) {
      if (fs::exists(p / name)) {
        s.weights = p / name;
        return s;
      }
    }
    if (auto latest = io::CheckpointManager(p.string()).latest()) {
      s.weights = *latest;
      s.kiln_checkpoint = true;
      return s;
    }
    throw std::runtime_error("--init-from " + arg +
                             " holds no model.safetensors, pytorch_model.bin or complete "
                             "ckpt-*.h5 checkpoint");
  }
  s.folder = p.has_parent_path() ? p.parent_path() : fs::path(".");
  s.weights = p;
  try {
    io::inspect_checkpoint(p.string());  // a kiln checkpoint, or else a weights file
    s.kiln_checkpoint = true;
  } catch (const kiln::Error& e) {
    // A .h5 file is meant as a checkpoint: say why it cannot be read rather than that it is no weights file.
    if (p.extension() == ".h5") throw std::runtime_error("--init-from " + arg + ": " + e.what());
  }
  return s;
}

// The model and tokenizer of an --init-from folder: config.json, vocab.txt (or --vocab), and the case
// handling from tokenizer_config.json (or --cased).
struct ModelFolder {
  InitSource init;
  models::BertConfig config;
  std::shared_ptr<data::WordPieceTokenizer> tokenizer;
};

ModelFolder read_model_folder(const std::string& init_from, const std::string& vocab, bool cased) {
  ModelFolder m;
  m.init = find_init(init_from);
  const fs::path config_path = m.init.folder / "config.json";
  if (!fs::exists(config_path)) {
    throw std::runtime_error("--init-from " + init_from + ": no config.json in " + m.init.folder.string() +
                             " (Hugging Face folders and --out folders of this example have one)");
  }
  m.config = read_bert_config(config_path);
  const fs::path vocab_path = vocab.empty() ? m.init.folder / "vocab.txt" : fs::path(vocab);
  if (!fs::is_regular_file(vocab_path)) {
    throw std::runtime_error("no vocabulary: " + vocab_path.string() + " does not exist; give --vocab vocab.txt");
  }
  const bool lower_case = read_lower_case(m.init.folder).value_or(!cased);
  m.tokenizer = std::make_shared<data::WordPieceTokenizer>(
      data::WordPieceTokenizer::from_vocab_file(vocab_path, {.lower_case = lower_case}));
  if (m.tokenizer->vocab_size() > m.config.vocab_size) {
    throw std::runtime_error(vocab_path.string() + " has " + std::to_string(m.tokenizer->vocab_size()) +
                             " tokens but the model only " + std::to_string(m.config.vocab_size) +
                             " (config.json); use the vocabulary the model was trained with");
  }
  return m;
}

// Loads what matches by name into `target` (a BertForMaskedLM or BertForSequenceClassification) and starts the
// rest fresh: pretraining's masked-LM head is dropped by a classifier and vice versa, a classifier head with
// another number of labels is re-initialised. The encoder itself must be there.
void load_initial_weights(nn::Module& target, const InitSource& init, const models::BertConfig& config,
                          const Runtime& rt) {
  const std::string path = init.weights.string();
  std::vector<std::string> fresh;
  if (init.kiln_checkpoint) {
    // A checkpoint of this example: build the model it holds (its metadata says which), load it, copy by name.
    const io::CheckpointInfo info = io::inspect_checkpoint(path);
    auto has = [&](const char* part) {
      return std::find(info.parts.begin(), info.parts.end(), part) != info.parts.end();
    };
    io::Metadata meta;
    if (has("metadata")) io::load_checkpoint(path, {.metadata = &meta});
    const std::string type = meta.strings.count("model_type") ? meta.strings["model_type"] : "";
    std::shared_ptr<nn::Module> source;
    if (type == "BertForMaskedLM") {
      source = std::make_shared<models::BertForMaskedLM>(config);
    } else if (type == "BertForSequenceClassification" && meta.numbers.count("num_labels")) {
      source = std::make_shared<models::BertForSequenceClassification>(
          config, static_cast<int64_t>(meta.numbers["num_labels"]));
    } else {
      throw std::runtime_error(path + " is a kiln checkpoint, but not of a BERT model of this example (" +
                               (type.empty() ? "its metadata names no model" : "its model is '" + type + "'") +
                               "); give a checkpoint of `bert pretrain` / `bert finetune`, or a Hugging Face BERT "
                               "folder");
    }
    if (!has("model")) throw std::runtime_error(path + " holds no model weights");
    try {
      io::load_checkpoint(path, {.model = source.get()});
    } catch (const kiln::Error& e) {
      throw std::runtime_error("the model in " + path + " does not match the config.json beside it: " + e.what());
    }
    fresh = target.load_state_dict(source->state_dict(), /*strict=*/false).missing_keys;
    if (rt.main()) std::cout << "initialised from " << path << " (" << type << ")\n";
  } else {
    // Hugging Face weights (BertForPreTraining, BertForMaskedLM, BertModel, BertForSequenceClassification...).
    // Not strict, deliberately: a pretraining checkpoint has heads this model lacks (unexpected) and lacks the
    // new classifier (missing); a classifier of another number of labels is mismatched. Each is handled below.
    const io::LoadReport r = io::load_weights(target, path, {.strict = false});
    if (rt.main()) std::cout << r.summary() << "\n";
    std::string bad;
    int64_t bad_count = 0;
    for (const auto& m : r.mismatched) {
      if (m.name.rfind("classifier.", 0) == 0) {
        fresh.push_back(m.name);  // another number of labels
      } else if (++bad_count <= 3) {
        auto shape = [](const kiln::Shape& sh) {
          std::ostringstream s;
          for (size_t i = 0; i < sh.size(); ++i) s << (i ? ", " : "(") << sh[i];
          return s.str() + ")";
        };
        bad += "\n  " + m.name + ": " + shape(m.file_shape) + " in the file, " + shape(m.model_shape) + " in the model";
      }
    }
    if (bad_count > 0) {
      throw std::runtime_error(path + " does not match config.json beside it (" + std::to_string(bad_count) +
                               " tensors of another shape):" + bad + (bad_count > 3 ? "\n  ..." : "") +
                               "\nuse the config.json that came with these weights");
    }
    fresh.insert(fresh.end(), r.missing.begin(), r.missing.end());
  }
  for (const auto& name : fresh) {
    if (name.rfind("bert.embeddings.", 0) == 0 || name.rfind("bert.encoder.", 0) == 0) {
      throw std::runtime_error(path + " has no value for " + name + " (and " + std::to_string(fresh.size() - 1) +
                               " other tensors); is it a BERT model of this config.json?");
    }
  }
  if (rt.main() && !fresh.empty()) std::cout << "newly initialised: " << ClassificationDataset::join(fresh) << "\n";
}

// ---------------------------------------------------------------- pretraining

std::shared_ptr<data::WordPieceTokenizer> pretrain_tokenizer(const std::string& vocab, int64_t build_vocab, bool cased,
                                                             const std::vector<fs::path>& files, const RunOptions& o,
                                                             const Runtime& rt) {
  const data::WordPieceOptions wo{.lower_case = !cased};
  if (!vocab.empty() && build_vocab > 0) throw std::runtime_error("give --vocab or --build-vocab, not both");
  if (!vocab.empty()) {
    if (!fs::is_regular_file(vocab)) {
      throw std::runtime_error("--vocab " + vocab +
                               " does not exist; give a BERT vocab.txt (one token per line), "
                               "or --build-vocab N to build a vocabulary of about N tokens from --text");
    }
    return std::make_shared<data::WordPieceTokenizer>(data::WordPieceTokenizer::from_vocab_file(vocab, wo));
  }
  if (build_vocab <= 0) {
    throw std::runtime_error(
        "pretraining needs a vocabulary: --vocab vocab.txt (e.g. bert-base-uncased's), --build-vocab N to build "
        "one of about N tokens from --text, or --init-from a model folder");
  }
  const fs::path built = fs::path(o.out) / "vocab.txt";
  if (o.resume && has_checkpoint(o) && fs::exists(built)) {  // the run being resumed built it
    return std::make_shared<data::WordPieceTokenizer>(data::WordPieceTokenizer::from_vocab_file(built, wo));
  }
  // Every rank builds the same vocabulary (a pure function of the text), so no rank waits for another's file.
  if (rt.main()) std::cout << "building a WordPiece vocabulary of " << build_vocab << " tokens from the text...\n";
  const data::WordPieceTrainerOptions trainer{.vocab_size = build_vocab, .lower_case = !cased};
  auto tokens = data::build_wordpiece_vocab_from_files(files, trainer);
  if (static_cast<int64_t>(tokens.size()) > build_vocab && rt.main()) {
    // The special tokens and every character of the text (also as "##c") are always kept, so that no word of
    // the text becomes [UNK]: a smaller --build-vocab cannot be met, and the model gets the larger vocabulary.
    const size_t specials = trainer.special_tokens.size(), characters = (tokens.size() - specials) / 2;
    std::cerr << "bert: warning: --build-vocab " << build_vocab << " is smaller than the " << tokens.size()
              << " tokens every vocabulary of this text needs (" << specials << " special tokens and its " << characters
              << " distinct characters, each also as ##c); the vocabulary has " << tokens.size()
              << " tokens and no word pieces. Give --build-vocab above " << tokens.size()
              << " for word pieces (BERT uses 30522).\n";
  } else if (rt.main()) {
    std::cout << "the vocabulary has " << tokens.size() << " tokens\n";
  }
  return std::make_shared<data::WordPieceTokenizer>(std::move(tokens), wo, built.string());
}

int pretrain(int argc, char** argv) {
  ex::Options opts("bert pretrain",
                   "Masked-LM pretraining of BERT on raw UTF-8 text: documents are runs of non-blank lines, cut "
                   "into [CLS] ... [SEP] sequences;\n15% of the tokens are chosen for prediction (80% become [MASK], "
                   "10% a random token, 10% stay), anew each epoch.");
  auto& text = opts.add_string("text", "", "text files or folders, comma-separated (required)");
  auto& vocab = opts.add_string("vocab", "", "a BERT vocab.txt (e.g. bert-base-uncased's)");
  auto& build_vocab = opts.add_int("build-vocab", 0,
                                   "build a WordPiece vocabulary of about N tokens from --text instead (saved as "
                                   "--out/vocab.txt)");
  auto& cased =
      opts.add_flag("cased", "keep case and accents (default: lower-case and strip accents, as uncased BERT)");
  auto& size = opts.add_string("size", "base", "base | large | tiny | custom");
  auto& layers = opts.add_int("layers", 0, "encoder layers (custom, or to override the size's)");
  auto& hidden = opts.add_int("hidden", 0, "hidden size");
  auto& heads = opts.add_int("heads", 0, "attention heads (must divide --hidden)");
  auto& intermediate = opts.add_int("intermediate", 0, "feed-forward size (4 x hidden in BERT)");
  auto& max_positions = opts.add_int("max-positions", 512,
                                     "position embeddings: the longest --seq-len the model will take (keep 512 "
                                     "to continue at 512 later)");
  auto& init_from = opts.add_string("init-from", "",
                                    "start from these weights instead (a --out folder of this example, one of its "
                                    "ckpt-*.h5, or a Hugging Face BERT folder): the 512 phase after the 128 one, "
                                    "or domain adaptation; the size and vocabulary are then the folder's");
  auto& mask_prob = opts.add_double("mask-prob", 0.15, "share of the tokens chosen for prediction");
  auto& max_predictions =
      opts.add_int("max-predictions", 0,
                   "at most this many predictions per sequence, as Google's BERT data (20 for --seq-len 128, 80 for "
                   "512): the masked-LM head then runs on those positions only; 0: every token is chosen with "
                   "probability --mask-prob and the head runs on every position");
  auto& short_seq = opts.add_double("short-seq-prob", 0.1, "share of sequences cut shorter (as Google's BERT data)");
  auto& export_onnx = add_export_option(opts, "(N, S, vocab): the masked-LM head's");
  const RunDefaults defaults{.seq_len = 128,
                             .batch = 32,
                             .epochs = 1,
                             .lr_adamw = 1e-4,
                             .lr_lamb = 2e-3,
                             .warmup_fraction = 0.01,
                             .ckpt_every = 1000,
                             .log_every = 50,
                             .out = "runs/bert-pretrain"};
  RunOptions o = add_run_options(opts, defaults);
  opts.parse(argc, argv);
  check_run_options(opts, o);
  if (text.empty()) opts.fail("give the text to pretrain on: --text FILE[,FILE|FOLDER...]");
  check_export_path(opts, export_onnx);
  if (o.seq_len < 3) opts.fail("--seq-len must be at least 3 ([CLS], a token, [SEP])");
  if (max_predictions < 0 || max_predictions > o.seq_len - 2) {
    opts.fail("--max-predictions must be in [0, --seq-len - 2 = " + std::to_string(o.seq_len - 2) + "]");
  }
  if (!init_from.empty() && build_vocab > 0) opts.fail("--init-from brings its vocabulary; drop --build-vocab");
  if (!init_from.empty() && (size != "base" || layers > 0 || hidden > 0 || heads > 0 || intermediate > 0)) {
    opts.fail(
        "--init-from brings the model size (its config.json); drop --size, --layers, --hidden, --heads and "
        "--intermediate");
  }

  const Runtime rt = start_runtime(o);
  check_cuda_graph(opts, o, rt);
  check_out_folder(o);
  const std::vector<fs::path> files = text_files(text);
  std::optional<ModelFolder> init;
  std::shared_ptr<data::WordPieceTokenizer> tok;
  models::BertConfig config;
  if (!init_from.empty()) {
    init = read_model_folder(init_from, vocab, cased);
    tok = init->tokenizer;
    config = init->config;
    size = "from " + init_from;
  } else {
    tok = pretrain_tokenizer(vocab, build_vocab, cased, files, o, rt);
    config = config_for(opts, size, layers, hidden, heads, intermediate, max_positions, tok->vocab_size());
  }
  if (o.seq_len > config.max_position_embeddings) {
    opts.fail("--seq-len " + std::to_string(o.seq_len) + " is longer than the model's " +
              std::to_string(config.max_position_embeddings) + " positions (--max-positions)");
  }

  // Tokenizes every file once, on all cores (the same sequences on every rank; the loader then shards them).
  auto dataset =
      std::make_shared<data::MaskedLMDataset>(files, *tok,
                                              data::MaskedLMOptions{.seq_len = o.seq_len,
                                                                    .mask_prob = mask_prob,
                                                                    .short_seq_prob = short_seq,
                                                                    .short_seq_seed = static_cast<uint64_t>(o.seed),
                                                                    .max_predictions = max_predictions});

  kiln::manual_seed(static_cast<uint64_t>(o.seed));  // the same initial weights on every rank
  auto mlm = nn::make<models::BertForMaskedLM>(config);
  if (init && !(o.resume && has_checkpoint(o))) load_initial_weights(*mlm, init->init, config, rt);
  mlm->to(rt.device);
  mlm->train();
  kiln::manual_seed(static_cast<uint64_t>(o.seed) + 1 + rt.env->rank);  // each rank its own dropout masks

  if (rt.main()) {
    std::cout << "BertForMaskedLM " << size << ": " << shape_of(config) << "; " << mlm->num_parameters()
              << " parameters\n"
              << dataset->describe() << "\n";
  }

  Task task;
  task.name = "pretrain";
  task.model = mlm;
  task.train = dataset;
  task.before_training = [&] {
    if (rt.main()) write_model_folder(o, config, "BertForMaskedLM", *tok);
  };
  mlm->bert->set_gradient_checkpointing(o.checkpointing);
  task.loss = [&](const data::Batch& b) { return mlm_loss(mlm, b); };
  task.meta.strings["model_type"] = "BertForMaskedLM";
  task.meta.numbers["lower_case"] = tok->options().lower_case ? 1 : 0;
  if (max_predictions > 0) task.meta.numbers["max_predictions"] = static_cast<double>(max_predictions);
  describe_config(task.meta, config);
  run_training(task, o, defaults, rt);
  if (rt.main()) save_weights(o, *mlm);
  if (rt.main() && !export_onnx.empty()) {
    export_model(
        export_onnx, *mlm,
        [&](const Tensor& ids, const Tensor& types, const Tensor& mask) {
          return mlm(ids, types, mask).logits;  // (N, S, vocab)
        },
        o.seq_len, rt.device);
  }
  return 0;
}

// ---------------------------------------------------------------- fine-tuning: evaluation

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t samples = 0;
};

// Loss and accuracy over the whole evaluation set: each rank its share (RankShard), then one all-reduce.
EvalResult evaluate(const nn::Handle<models::BertForSequenceClassification>& clf, data::DataLoader& loader,
                    const Runtime& rt) {
  clf->eval();  // dropout off
  kiln::NoGradGuard no_grad;
  const kiln::TensorOptions f64{.dtype = DType::Float64, .device = rt.device};
  Tensor hits = kiln::zeros({}, f64), loss_sum = kiln::zeros({}, f64);
  int64_t n = 0;
  for (data::Batch& b : loader.epoch(0)) {
    std::optional<kiln::amp::Autocast> cast;
    if (rt.amp) cast.emplace(*rt.amp);
    const auto out = clf(b["input_ids"], b["token_type_ids"], b["attention_mask"], b["labels"]);
    const int64_t count = b.batch_size();
    hits += (out.logits.argmax(-1) == b["labels"]).sum().to(DType::Float64);
    loss_sum += out.loss.to(DType::Float64) * static_cast<double>(count);  // the batch's mean back to a sum
    n += count;
  }
  clf->train();
  Tensor totals = kiln::stack({hits, loss_sum, kiln::scalar_tensor(static_cast<double>(n), f64)});  // (3)
  dist::all_reduce(totals);  // sums over the ranks
  const std::vector<double> v = totals.to_vector<double>();
  EvalResult r;
  r.samples = static_cast<int64_t>(v[2]);
  if (r.samples > 0) {
    r.accuracy = v[0] / v[2];
    r.loss = v[1] / v[2];
  }
  return r;
}

// ---------------------------------------------------------------- fine-tuning

int finetune(int argc, char** argv) {
  ex::Options opts("bert finetune",
                   "Fine-tunes BERT for sequence classification from a `bert pretrain` run or Hugging Face weights.\n"
                   "TSV lines: label<TAB>text, or label<TAB>text_a<TAB>text_b for sentence pairs. Labels are names "
                   "(sorted: class 0, 1, ...)\nor integers 0..K-1. Prints the evaluation loss and accuracy after "
                   "each epoch (eval.csv).");
  auto& train_path = opts.add_string("train", "", "training TSV file (required)");
  auto& eval_path = opts.add_string("eval", "", "evaluation TSV file (required)");
  auto& init_from = opts.add_string("init-from", "",
                                    "a `bert pretrain --out` folder or one of its ckpt-*.h5, or a "
                                    "Hugging Face BERT folder (required)");
  auto& vocab = opts.add_string("vocab", "", "vocab.txt to use instead of the one in --init-from's folder");
  auto& cased = opts.add_flag("cased", "keep case (when the folder has no tokenizer_config.json saying so)");
  auto& export_onnx = add_export_option(opts, "(N, labels)");
  const RunDefaults defaults{.seq_len = 128,
                             .batch = 32,
                             .epochs = 3,
                             .lr_adamw = 2e-5,
                             .lr_lamb = 1e-4,
                             .warmup_fraction = 0.1,
                             .ckpt_every = 0,
                             .log_every = 10,
                             .out = "runs/bert-finetune"};
  RunOptions o = add_run_options(opts, defaults);
  opts.parse(argc, argv);
  check_run_options(opts, o);
  if (train_path.empty() || eval_path.empty()) opts.fail("give --train FILE.tsv and --eval FILE.tsv");
  check_export_path(opts, export_onnx);

  const Runtime rt = start_runtime(o);
  check_cuda_graph(opts, o, rt);
  check_out_folder(o);
  if (init_from.empty()) {
    opts.fail(
        "fine-tuning starts from pretrained weights: give --init-from with a --out folder of `bert "
        "pretrain`, one of its ckpt-*.h5 files, or a Hugging Face BERT folder (config.json, vocab.txt, "
        "model.safetensors or pytorch_model.bin)");
  }
  const ModelFolder init = read_model_folder(init_from, vocab, cased);
  const models::BertConfig& config = init.config;
  const std::shared_ptr<data::WordPieceTokenizer> tok = init.tokenizer;
  const bool lower_case = tok->options().lower_case;
  if (o.seq_len > config.max_position_embeddings) {
    opts.fail("--seq-len " + std::to_string(o.seq_len) + " is longer than the model's " +
              std::to_string(config.max_position_embeddings) + " positions");
  }

  const std::vector<std::string> labels = label_names(read_tsv(train_path));
  if (labels.size() < 2) {
    throw std::runtime_error(train_path + " has a single label (" + labels[0] + "); classification needs two or more");
  }
  auto train = std::make_shared<ClassificationDataset>(train_path, tok, o.seq_len, labels);
  auto eval = std::make_shared<ClassificationDataset>(eval_path, tok, o.seq_len, labels);

  kiln::manual_seed(static_cast<uint64_t>(o.seed));
  auto clf = nn::make<models::BertForSequenceClassification>(config, static_cast<int64_t>(labels.size()));
  const bool resuming = o.resume && has_checkpoint(o);
  if (!resuming) load_initial_weights(*clf, init.init, config, rt);  // a resumed run has it all in its checkpoint
  clf->to(rt.device);
  clf->train();
  kiln::manual_seed(static_cast<uint64_t>(o.seed) + 1 + rt.env->rank);

  if (rt.main()) {
    std::cout << "BertForSequenceClassification: " << shape_of(config) << ", " << labels.size() << " labels ("
              << ClassificationDataset::join(labels) << "); " << clf->num_parameters() << " parameters\n"
              << train->describe() << ", eval " << eval->describe() << "\n";
  }

  data::DataLoaderOptions eval_options{
      .batch_size = o.batch,
      .workers = static_cast<int>(o.workers),
      .pin_memory = rt.device.is_cuda(),
      .sampler = std::make_shared<RankShard>(eval->size(), rt.env->rank, rt.env->world_size)};
  // (evaluated as epoch 0 every time: the default, prefetch_next_epoch = false, loads nothing ahead)
  if (rt.device.is_cuda()) eval_options.device = rt.device;
  data::DataLoader eval_loader(eval, eval_options);
  std::optional<kiln::monitor::MetricsLogger> eval_log;  // rank 0's, opened in before_training

  Task task;
  task.name = "finetune";
  task.model = clf;
  task.train = train;
  task.before_training = [&] {
    if (!rt.main()) return;
    write_model_folder(o, config, "BertForSequenceClassification", *tok, labels);
    // eval.csv, and eval/... scalars beside train/... in the --tensorboard folder (its one writer, shared).
    eval_log.emplace(
        kiln::monitor::MetricsOptions{.csv = fs::path(o.out) / "eval.csv",
                                      .columns = {"epoch", "step", "eval_loss", "eval_accuracy", "eval_samples"},
                                      .tensorboard = task.tensorboard,
                                      .tag_prefix = "eval/",
                                      .resume_step = task.resume_step});
  };
  clf->bert->set_gradient_checkpointing(o.checkpointing);
  task.loss = [&](const data::Batch& b) { return classification_loss(clf, b); };
  task.after_epoch = [&](int64_t epoch, int64_t step) {
    const EvalResult r = evaluate(clf, eval_loader, rt);
    if (!rt.main()) return;
    std::printf("epoch %lld step %lld  eval loss %.4f  accuracy %.2f%% (%lld samples)\n", static_cast<long long>(epoch),
                static_cast<long long>(step), r.loss, 100 * r.accuracy, static_cast<long long>(r.samples));
    std::fflush(stdout);
    eval_log->log(step, {{"epoch", epoch},
                         {"eval_loss", r.loss},
                         {"eval_accuracy", r.accuracy},
                         {"eval_samples", static_cast<double>(r.samples)}});
  };
  task.meta.strings["model_type"] = "BertForSequenceClassification";
  task.meta.strings["labels"] = ClassificationDataset::join(labels);
  task.meta.numbers["num_labels"] = static_cast<double>(labels.size());
  task.meta.numbers["lower_case"] = lower_case ? 1 : 0;
  describe_config(task.meta, config);
  run_training(task, o, defaults, rt);
  if (rt.main()) save_weights(o, *clf);
  if (rt.main() && !export_onnx.empty()) {  // after the last epoch's evaluation (task.after_epoch)
    export_model(
        export_onnx, *clf,
        [&](const Tensor& ids, const Tensor& types, const Tensor& mask) {
          return clf(ids, types, mask).logits;  // (N, labels)
        },
        o.seq_len, rt.device);
  }
  return 0;
}

// ---------------------------------------------------------------- main

void usage(std::ostream& out) {
  out << "usage: bert pretrain --text FILE[,FILE|FOLDER...] (--vocab vocab.txt | --build-vocab N) [options]\n"
         "       bert finetune --train train.tsv --eval dev.tsv --init-from FOLDER_OR_CHECKPOINT [options]\n"
         "       mpirun -np N bert MODE ...   (one process per GPU, data-parallel)\n\n"
         "BERT masked-LM pretraining from raw text, and fine-tuning for sequence classification, on a GPU,\n"
         "on the CPU, or on several GPUs. `bert pretrain --help` and `bert finetune --help` list the options.\n";
}

}  // namespace
}  // namespace bert_example

int main(int argc, char** argv) {
  using namespace bert_example;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--help" || mode == "-h" || mode == "help") {
    usage(std::cout);
    return 0;
  }
  if (mode != "pretrain" && mode != "finetune") {
    usage(std::cerr);
    std::cerr << "\nbert: " << (mode.empty() ? "give a mode" : "unknown mode '" + mode + "'")
              << ": pretrain or finetune\n";
    return 2;
  }
  try {
    return mode == "pretrain" ? pretrain(argc - 1, argv + 1) : finetune(argc - 1, argv + 1);
  } catch (const std::exception& e) {
    const bool several = kiln::dist::is_initialized() && kiln::dist::world_size() > 1;
    // One write, so that the messages of several ranks do not interleave.
    const std::string who = several ? " (rank " + std::to_string(kiln::dist::rank()) + ")" : "";
    std::cerr << ("bert " + mode + who + ": error: " + e.what() + "\n") << std::flush;
    // With several processes, skip the exit-time MPI finalisation: it could wait for ranks that are blocked in
    // a collective. Ending now lets mpirun see the failure and end the job.
    if (several) std::_Exit(1);
    return 1;
  }
}
