// examples/quickstart/quickstart.cpp — a first look at kiln: tensors, then training with autograd.
//
// The forward pass of a tiny linear classifier on random data, a few reductions and views, then the
// same classifier trained by gradient descent on generated data (labels from a hidden "teacher"),
// with gradients from loss.backward(). Everything runs on the CPU backend; the program checks its own
// results and exits with 1 when one is wrong, so CTest runs it as a smoke test.
#include <kiln/kiln.h>  // Tensor, kiln::randn, kiln::matmul, kiln::softmax, ..., KILN_VERSION_STRING

#include <cstdlib>   // EXIT_SUCCESS, EXIT_FAILURE
#include <iostream>  // std::cout, std::cerr
#include <string>

using namespace kiln;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::cout << (ok ? "  ok:     " : "  FAILED: ") << what << "\n";
  if (!ok) ++failures;
}

int run() {
  std::cout << "kiln " << KILN_VERSION_STRING << " quick start\n\n";
  manual_seed(42);  // the same numbers on every run, on every backend

  // A batch of 4 examples with 3 features, scored against 5 classes.
  const int64_t batch = 4, features = 3, classes = 5;
  Tensor x = randn({batch, features});    // (B, F)
  Tensor w = randn({features, classes});  // (F, C)
  Tensor b = full({classes}, 0.1);        // (C), broadcast over the batch

  Tensor logits = matmul(x, w) + b;      // (B, C)
  Tensor probs = softmax(logits, -1);    // (B, C), each row sums to 1
  Tensor predicted = probs.argmax(-1);   // (B), Int64 class indices
  Tensor confidence = probs.amax({-1});  // (B)

  std::cout << "x = " << x << "\n\n";
  std::cout << "logits = x @ w + b = " << logits << "\n\n";
  std::cout << "softmax(logits, -1) = " << probs << "\n\n";
  std::cout << "predicted class = " << predicted << "\n";
  std::cout << "confidence      = " << confidence << "\n\n";

  // Reductions over the whole tensor and along one dim.
  std::cout << "logits: sum " << logits.sum().item<float>() << ", mean " << logits.mean().item<float>() << ", max "
            << logits.max().item<float>() << ", min " << logits.min().item<float>() << "\n";
  std::cout << "per-class mean of x @ w: " << matmul(x, w).mean({0}) << "\n\n";

  // Views share memory with the tensor they come from; contiguous() copies when the layout needs it.
  Tensor xt = x.t();  // (F, B), a view
  std::cout << "x.t() is a view of x: " << std::boolalpha << xt.is_alias_of(x) << ", contiguous: " << xt.is_contiguous()
            << "\n";
  Tensor grid = arange(12).reshape({3, 4});  // (3, 4) Int64: 0..11
  std::cout << "arange(12).reshape({3, 4}) = " << grid << "\n";
  std::cout << "column sums = " << grid.sum({0}) << "\n\n";

  // Training: learn w and b so that argmax(x @ w + b) matches labels made by a hidden teacher.
  // The gradients of the cross-entropy loss come from autograd; the update is plain SGD.
  const int64_t n = 256;
  Tensor teacher = randn({features, classes});
  Tensor data = randn({n, features});                           // (N, F)
  Tensor labels = matmul(data, teacher).argmax(-1);             // (N) Int64
  Tensor target = one_hot(labels, classes).to(DType::Float32);  // (N, C)
  Tensor tw = zeros({features, classes}).requires_grad_();      // parameters: gradients accumulate here
  Tensor tb = zeros({classes}).requires_grad_();
  auto loss_fn = [&] { return -(log_softmax(matmul(data, tw) + tb, -1) * target).sum({-1}).mean(); };
  const float initial_loss = loss_fn().item<float>();
  float loss_value = initial_loss;
  for (int step = 0; step < 200; ++step) {
    Tensor loss = loss_fn();  // records the graph: tw, tb -> matmul -> add -> log_softmax -> ... -> loss
    loss.backward();          // fills tw.grad() and tb.grad()
    {
      NoGradGuard no_grad;  // the update itself is not part of any graph
      tw.sub_(tw.grad() * 0.5);
      tb.sub_(tb.grad() * 0.5);
    }
    tw.mutable_grad() = Tensor();  // zero the gradients for the next step
    tb.mutable_grad() = Tensor();
    loss_value = loss.item<float>();
    if (step % 50 == 0 || step == 199) std::cout << "step " << step << ": loss " << loss_value << "\n";
  }
  const float accuracy = (matmul(data, tw) + tb).argmax(-1).eq(labels).to(DType::Float32).mean().item<float>();
  std::cout << "training accuracy after 200 steps: " << accuracy << "\n\n";

  std::cout << "checks:\n";
  check(logits.shape() == Shape{batch, classes}, "logits have shape (4, 5)");
  check(allclose(probs.sum({-1}), ones({batch}), 1e-5, 1e-6), "softmax rows sum to 1");
  check(probs.min().item<float>() > 0.0f, "softmax outputs are positive");
  check(equal(predicted, logits.argmax(-1)), "softmax keeps the argmax of the logits");
  check(allclose(matmul(x, w), (x.unsqueeze(2) * w.unsqueeze(0)).sum({1}), 1e-5, 1e-5),
        "matmul equals the broadcast multiply-and-sum");
  check(grid.sum().item<int64_t>() == 66, "0 + 1 + ... + 11 == 66");
  check(xt.is_alias_of(x) && !xt.is_contiguous(), "transpose is a non-contiguous view");
  check(loss_value < 0.5f * initial_loss, "training reduces the loss to less than half");
  check(accuracy > 0.9f, "the trained classifier agrees with the teacher on > 90% of the data");

  if (failures > 0) {
    std::cout << "\n" << failures << " check(s) failed\n";
    return EXIT_FAILURE;
  }
  std::cout << "\nall checks passed\n";
  return EXIT_SUCCESS;
}

}  // namespace

int main() {
  // kiln reports misuse (and ops not written yet) as kiln::Error, with a message that says what
  // went wrong and what to do: print it rather than let the program abort.
  try {
    return run();
  } catch (const kiln::Error& e) {
    std::cout << std::flush;
    std::cerr << "\nquickstart: error: " << e.what() << "\n";
    return EXIT_FAILURE;
  }
}
