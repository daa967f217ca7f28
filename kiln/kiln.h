// kiln/kiln.h — the umbrella header: everything a training program uses.
//
//   #include <kiln/kiln.h>
//   using namespace kiln;
//   Tensor x = randn({2, 3});
//   std::cout << (x * 2).sum() << "\n";
#pragma once

#include "kiln/autograd/amp.h"          // amp::Autocast: an autocast region with the weight-cast cache
#include "kiln/autograd/autocast.h"     // autocast::Guard, the per-op policy table
#include "kiln/autograd/checkpoint.h"   // autograd::checkpoint
#include "kiln/autograd/engine.h"       // autograd::backward, autograd::grad
#include "kiln/autograd/fp8.h"          // amp::Fp8Recipe, amp::Fp8ScalingState: FP8 delayed scaling
#include "kiln/autograd/function.h"     // autograd::Function: custom forward + backward
#include "kiln/autograd/functions.h"    // kiln::zeros, kiln::matmul, kiln::softmax, ... (differentiable)
#include "kiln/autograd/grad_mode.h"    // NoGradGuard, EnableGradGuard
#include "kiln/autograd/gradcheck.h"    // autograd::gradcheck
#include "kiln/data/dataloader.h"       // data::DataLoader: worker threads, prefetch, device delivery, wait stats
#include "kiln/data/dataset.h"          // data::Dataset, data::Example, data::Batch, data::SampleRng
#include "kiln/data/datasets.h"         // data::MNIST, data::CIFAR10/100, data::HDF5Dataset, data::SyntheticDataset
#include "kiln/data/distributed_env.h"  // data::distributed_env: rank, world size, local rank from the launcher
#include "kiln/data/image.h"            // data::read_image, data::decode_image, data::image_size (JPEG, PNG)
#include "kiln/data/image_folder.h"     // data::ImageFolder: root/<class>/<images>, as torchvision
#include "kiln/data/image_resize.h"     // data::resize_image: antialiased bilinear, uint8 (H, W, C)
#include "kiln/data/sampler.h"  // data::SequentialSampler, RandomSampler, WeightedRandomSampler, DistributedSampler
#include "kiln/data/text/mlm_dataset.h"    // data::MaskedLMDataset: BERT masked-LM samples from text files
#include "kiln/data/text/text_check.h"     // data::TextCheck: refuses files that are not UTF-8 text
#include "kiln/data/text/vocab_builder.h"  // data::build_wordpiece_vocab: a WordPiece vocabulary from text
#include "kiln/data/text/wordpiece.h"      // data::WordPieceTokenizer, data::BasicTokenizer (BERT vocab.txt)
#include "kiln/data/transforms.h"          // data::transforms::Compose, RandomResizedCrop, Normalize, presets, ...
#include "kiln/distributed/data_parallel.h"  // dist::DataParallel: bucketed gradient all-reduce during backward
#include "kiln/distributed/environment.h"    // dist::init: rank, world size, this process's GPU, the bootstrap
#include "kiln/distributed/hybrid_placement.h"  // dist::share_placement: one HybridEmbedding placement on all ranks
#include "kiln/distributed/process_group.h"  // dist::all_reduce, broadcast, all_gather, reduce_scatter, barrier
#include "kiln/distributed/sparse_sync.h"    // dist::all_gather_sparse_grads: replicated embedding tables
#include "kiln/distributed/sync_batch_norm.h"  // dist::convert_sync_batchnorm: batch statistics over all ranks
#include "kiln/io/checkpoint.h"            // io::save_checkpoint, io::load_checkpoint: HDF5, atomic, checksummed
#include "kiln/io/checkpoint_manager.h"    // io::CheckpointManager: keep the last K, resume from the newest complete
#include "kiln/io/pretrained.h"            // io::load_weights: torchvision/Hugging Face weights by name, with a report
#include "kiln/io/onnx_export.h"           // io::export_onnx: a trained model as ONNX, for ONNX Runtime and TensorRT
#include "kiln/io/safetensors.h"           // io::load_safetensors, io::save_safetensors
#include "kiln/io/torch_file.h"            // io::load_torch_file: PyTorch's torch.save zip files (tensors only)
#include "kiln/layers/attention.h"         // nn::scaled_dot_product_attention, nn::MultiheadAttention
#include "kiln/layers/containers.h"        // nn::Sequential, nn::ModuleList, nn::ModuleDict
#include "kiln/layers/conv.h"              // nn::conv2d, nn::Conv2d
#include "kiln/layers/functional.h"     // nn::linear, nn::dropout, nn::layer_norm, nn::batch_norm, nn::embedding, ...
#include "kiln/layers/hybrid_embedding.h"  // nn::HybridEmbedding: hot rows on the GPU, cold rows in host memory
#include "kiln/layers/init.h"           // nn::init::kaiming_uniform_, xavier_normal_, trunc_normal_, ...
#include "kiln/layers/layers.h"         // nn::Linear, nn::Dropout, nn::Embedding, nn::LayerNorm, nn::BatchNorm2d, ...
#include "kiln/layers/loss.h"           // nn::cross_entropy, nn::nll_loss, nn::mse_loss, nn::Reduction, ...
#include "kiln/layers/models/bert.h"    // models::BertConfig, models::BertModel, models::BertForMaskedLM, ...
#include "kiln/layers/models/resnet.h"  // nn::models::resnet18/34/50/101/152, ResNet, BasicBlock, Bottleneck
#include "kiln/layers/module.h"         // nn::Module: parameters, buffers, children, to(), state_dict()
#include "kiln/layers/pooling.h"        // nn::max_pool2d, nn::avg_pool2d, nn::adaptive_avg_pool2d, nn::MaxPool2d, ...
#include "kiln/monitor/gpu_monitor.h"   // monitor::gpu_stats: GPU utilisation, memory and power through NVML
#include "kiln/monitor/metrics.h"       // monitor::MetricsLogger: metrics to CSV and TensorBoard, resumable
#include "kiln/optim/adam.h"            // optim::Adam, optim::AdamW
#include "kiln/optim/clip_grad.h"       // optim::clip_grad_norm_, clip_grad_value_ (and as nn::utils::)
#include "kiln/optim/grad_scaler.h"     // amp::GradScaler
#include "kiln/optim/lamb.h"            // optim::LAMB
#include "kiln/optim/lr_scheduler.h"    // optim::StepLR, optim::CosineAnnealingLR, optim::OneCycleLR, warmups, ...
#include "kiln/optim/optimizer.h"       // optim::Optimizer: parameter groups, state, state_dict
#include "kiln/optim/rowwise_adagrad.h"  // optim::RowWiseAdagrad: one Adagrad accumulator per embedding row
#include "kiln/optim/sgd.h"             // optim::SGD (sparse gradients too)
#include "kiln/optim/sparse_adam.h"     // optim::SparseAdam: lazy Adam for sparse embedding gradients
#include "kiln/profiler/nvtx.h"        // profiler::enable_nvtx: kiln's steps, modules and ops in Nsight Systems
#include "kiln/profiler/profiler.h"    // profiler::Profile: host and GPU time per op, Chrome trace, top-ops table
#include "kiln/tensor/determinism.h"    // set_deterministic: bit-for-bit reproducible GPU training
#include "kiln/tensor/env_vars.h"       // env_flag, env_positive_int: KILN_* environment variables
#include "kiln/tensor/generator.h"      // Generator, manual_seed
#include "kiln/tensor/tensor.h"         // Tensor, DType, Device, Scalar, TensorOptions
#include "kiln/tensor/threads.h"        // num_threads, set_num_threads
#include "kiln/version.h"               // KILN_VERSION_STRING
