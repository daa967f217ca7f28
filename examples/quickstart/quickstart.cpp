// examples/quickstart/quickstart.cpp — kiln's first program: a small convolutional network learns to read
// handwritten digits.
//
// The data is real and ships with the repository (examples/quickstart/data/, made by make_digits.py): the UCI
// handwritten-digits set, 1,437 training and 360 test images of 8x8 pixels, in MNIST's file format, so the same
// program trains on MNIST itself with --data <folder with MNIST's files> (28x28: the network adapts).
// It runs on the GPU when there is one and on the CPU otherwise, prints its progress, and checks that the
// test accuracy reaches --target (exit status 1 if not): CTest runs it as the test of the quick start.
//
//   ./build/examples/quickstart/quickstart                 # about 10 s on 2 CPU cores
//   ./build/examples/quickstart/quickstart --epochs 20 --device cpu
//   ./build/examples/quickstart/quickstart --data ~/data/mnist --target 0.98
//   ./build/examples/quickstart/quickstart --metrics runs/qs/metrics.csv --tensorboard runs/qs/tb
#include <kiln/kiln.h>  // Tensor, nn::, optim::, data::

#include <cstdio>
#include <memory>

#include "example_util.h"  // ex::Options (--help), ex::pick_device, ex::Progress

using namespace kiln;

namespace {

// (N, 1, H, W) -> (N, 10): two 3x3 convolutions, a 2x2 max pool, two linear layers.
nn::Handle<nn::Sequential> make_model(int64_t height, int64_t width) {
  using namespace nn;
  const int64_t features = 32 * (height / 2) * (width / 2);
  return nn::make<Sequential>(Conv2d(1, 16, 3, {.padding = 1}), ReLU(),   // (N, 16, H, W)
                              Conv2d(16, 32, 3, {.padding = 1}), ReLU(),  // (N, 32, H, W)
                              MaxPool2d({.kernel_size = 2}),              // (N, 32, H/2, W/2)
                              Flatten(),                                  // (N, 32 H/2 W/2)
                              Linear(features, 64), ReLU(),               //
                              Linear(64, 10));                            // (N, 10) logits
}

// The share of `loader`'s samples whose most likely class is their label.
double accuracy(nn::Module& model, data::DataLoader& loader) {
  NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0, total = 0;
  for (data::Batch& batch : loader.epoch(0)) {
    auto [x, y] = batch;
    correct += (model(x).argmax(-1) == y).sum().item<int64_t>();
    total += y.numel();
  }
  model.train();
  return static_cast<double>(correct) / static_cast<double>(total);
}

}  // namespace

int main(int argc, char** argv) {
  ex::Options opts("quickstart",
                   "Trains a small convolutional network on handwritten digits and checks its "
                   "test accuracy.");
  auto& data_dir = opts.add_string("data", KILN_QUICKSTART_DATA, "folder with MNIST-format IDX files");
  auto& epochs = opts.add_int("epochs", 12, "passes over the training set");
  auto& batch_size = opts.add_int("batch-size", 32, "images per step");
  auto& lr = opts.add_double("lr", 2e-3, "AdamW's learning rate (cosine decay to 0)");
  auto& target = opts.add_double("target", 0.97, "test accuracy to reach (exit status 1 below it)");
  auto& device_name = opts.add_string("device", "auto", "auto | cpu | cuda");
  auto& seed = opts.add_int("seed", 0, "seed of the weights and the shuffle");
  auto& metrics_csv = opts.add_string("metrics", "", "write a row per epoch to this CSV file");
  auto& tensorboard = opts.add_string("tensorboard", "", "also log the metrics as TensorBoard event files to DIR");
  opts.parse(argc, argv);
  if (!(lr > 0)) opts.fail("--lr must be positive");
  if (epochs < 1 || batch_size < 1) opts.fail("--epochs and --batch-size must be at least 1");

  try {
    const dist::Env& env = dist::init();
    const Device dev = ex::pick_device(device_name, env);
    manual_seed(static_cast<uint64_t>(seed));

    // uint8 (H, W, 1) -> float32 (1, H, W) in [0, 1], normalised.
    namespace T = data::transforms;
    T::Compose to_input{T::ToTensor(), T::Normalize({0.5}, {0.5})};
    auto train =
        std::make_shared<data::MNIST>(data_dir, data::MNISTOptions{.split = data::Split::Train, .transform = to_input});
    auto test =
        std::make_shared<data::MNIST>(data_dir, data::MNISTOptions{.split = data::Split::Test, .transform = to_input});
    const int64_t height = train->images().size(1), width = train->images().size(2);
    std::printf("kiln %s quick start: %s (%lld training, %lld test images of %lldx%lld) on %s\n", KILN_VERSION_STRING,
                data_dir.c_str(), static_cast<long long>(train->size()), static_cast<long long>(test->size()),
                static_cast<long long>(height), static_cast<long long>(width), dev.str().c_str());

    // Epochs 0, 1, 2, ... in order: the workers go on into the next epoch while the last batches are in use.
    data::DataLoader train_loader(train, {.batch_size = batch_size,
                                          .workers = 2,
                                          .shuffle = true,
                                          .seed = static_cast<uint64_t>(seed),
                                          .device = dev,
                                          .prefetch_next_epoch = true});
    // Evaluated as epoch 0 every time: by default nothing is loaded ahead for an epoch that is never asked for.
    data::DataLoader test_loader(test, {.batch_size = 256, .workers = 2, .device = dev});

    auto model = make_model(height, width);
    model->to(dev);
    std::printf("model: %lld parameters\n", static_cast<long long>(model->num_parameters()));
    optim::AdamW opt(model->parameters(), {.lr = lr, .weight_decay = 1e-4});
    const int64_t steps_per_epoch = train_loader.size();
    optim::CosineAnnealingLR schedule(opt, epochs * steps_per_epoch);
    ex::Progress progress(epochs * steps_per_epoch, batch_size, dev);
    // Off unless --metrics or --tensorboard is given (rank 0 only, should this run under a launcher).
    monitor::MetricsLogger metrics({.csv = metrics_csv,
                                    .columns = {"epoch", "step", "train_loss", "test_accuracy", "lr"},
                                    .tensorboard_dir = tensorboard,
                                    .enabled = env.is_main()});

    int64_t step = 0;
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      Tensor loss_sum = zeros({}, {.device = dev});  // summed on the device: no host sync inside the epoch
      for (data::Batch& batch : train_loader.epoch(static_cast<uint64_t>(epoch))) {
        auto [x, y] = batch;  // (B, 1, H, W) float32, (B) int64
        opt.zero_grad();
        Tensor loss = nn::cross_entropy(model(x), y);
        loss.backward();
        opt.step();
        schedule.step();
        loss_sum.add_(loss.detach());
        ++step;
      }
      const double mean_loss = loss_sum.item<double>() / static_cast<double>(steps_per_epoch);
      const double lr_now = schedule.last_lr()[0], test_accuracy = accuracy(*model, test_loader);
      std::printf("%s  test accuracy %.1f%%\n",
                  progress.line(epoch + 1, step, step, mean_loss, lr_now, train_loader.stats().wait_fraction).c_str(),
                  100.0 * test_accuracy);
      metrics.log(step,
                  {{"epoch", epoch + 1}, {"train_loss", mean_loss}, {"test_accuracy", test_accuracy}, {"lr", lr_now}});
    }
    const double acc = accuracy(*model, test_loader);
    const bool reached = acc >= target;
    std::printf("final test accuracy %.2f%% (target %.1f%%): %s\n", 100.0 * acc, 100.0 * target,
                reached ? "reached" : "NOT reached");
    return reached ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 1;
  }
}
