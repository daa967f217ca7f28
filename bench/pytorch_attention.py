"""PyTorch's scaled_dot_product_attention on the cases of bench_attention.cpp: bf16, 128 x 12 x 128 x 64 and
64 x 12 x 512 x 64, forward + backward, through each of torch's backends (cuDNN, flash, math). Median of 50
steps after 10 warm-up steps, timed with CUDA events, in bench_attention's format.

    python3 bench/pytorch_attention.py
"""
import torch
from torch_timing import median_step_ms
from torch.nn.attention import SDPBackend, sdpa_kernel


def run(b, h, l, e):
    q, k, v = (torch.randn(b, h, l, e, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, h, l, e, device="cuda", dtype=torch.bfloat16)
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("math", SDPBackend.MATH)):
        def step():
            q.grad = k.grad = v.grad = None
            with sdpa_kernel(backend):
                torch.nn.functional.scaled_dot_product_attention(q, k, v).backward(dout)
        print(f"torch sdpa bf16 fwd+bwd {b:3d} x {h} x {l:4d} x {e}  {name:<10} {median_step_ms(step, 10, 50):8.3f} ms")


def main():
    if not torch.cuda.is_available():
        print("pytorch_attention: no GPU visible")
        return
    print(f"pytorch {torch.__version__}")
    run(128, 12, 128, 64)
    run(64, 12, 512, 64)


if __name__ == "__main__":
    main()
