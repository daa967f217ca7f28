"""PyTorch's batch norm in training (torch.nn.BatchNorm2d, cuDNN) on the cases of bench_batch_norm.cpp:
ResNet-50's batch-norm shapes at batch 256, bf16, channels-last; forward, and forward + backward with a given
output gradient. Median of 20 steps after 5, timed with CUDA events, in bench_batch_norm's format.

    python3 bench/pytorch_batch_norm.py
"""
import torch
from torch_timing import median_step_ms

CASES = [(64, 112, 1), (64, 56, 6), (256, 56, 4), (128, 56, 1), (128, 28, 7), (512, 28, 5), (256, 28, 1),
         (256, 14, 11), (1024, 14, 7), (512, 14, 1), (512, 7, 5), (2048, 7, 4)]


def main():
    if not torch.cuda.is_available():
        print("pytorch_batch_norm: no GPU visible")
        return
    print(f"pytorch {torch.__version__}")
    torch.backends.cudnn.benchmark = True
    n = 256
    fwd_sum = both_sum = 0.0
    for c, hw, count in CASES:
        x = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        x.requires_grad_()
        dy = torch.randn_like(x)
        bn = torch.nn.BatchNorm2d(c).cuda()

        def forward():
            with torch.no_grad():
                bn(x)

        def both():
            x.grad = None
            bn.zero_grad(set_to_none=True)
            bn(x).backward(dy)

        fwd = median_step_ms(forward, 5, 20)
        fb = median_step_ms(both, 5, 20)
        nbytes = x.numel() * 2
        print(f"torch batch_norm bf16 NHWC {n:3d} x {c:4d} x {hw:3d} x {hw:3d}  fwd {fwd:7.3f} ms "
              f"{3 * nbytes / fwd / 1e6:6.0f} GB/s  fwd+bwd {fb:7.3f} ms  bwd {5 * nbytes / (fb - fwd) / 1e6:6.0f} GB/s  "
              f"(x{count} in ResNet-50)")
        fwd_sum += fwd * count
        both_sum += fb * count
    print(f"torch batch_norm ResNet-50's 53 layers at batch {n}: fwd {fwd_sum:.2f} ms, fwd+bwd {both_sum:.2f} ms")


if __name__ == "__main__":
    main()
