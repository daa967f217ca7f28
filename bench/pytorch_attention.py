"""PyTorch's scaled_dot_product_attention on the cases of bench_attention.cpp: bf16, 128 x 12 x 128 x 64 and
64 x 12 x 512 x 64, forward + backward, through each of torch's backends (cuDNN, flash, math). Median of 50
steps after 10 warm-up steps, timed with CUDA events, in bench_attention's format.

    python3 bench/pytorch_attention.py
    python3 bench/pytorch_attention.py --bert

--bert: the variants of `bench_attention --bert` (BERT-base 128 x 12 x 128 x 64 and BERT-large 64 x 16 x 128 x 64:
bhsd, packed, +mask, +dropout), each through the cuDNN, flash and memory-efficient backends where the backend takes
it, captured as CUDA graphs (forward alone, and forward + backward) and timed over replays, in its format.
"""
import sys

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


def graphed_ms(step):
    """The median GPU time of one replay of `step` captured as a CUDA graph (after warm-up on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return median_step_ms(graph.replay, 10, 50)


def run_bert(model, n, heads, l, d):
    hidden = heads * d
    packed = torch.randn(n, l, 3 * hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    plain = [torch.randn(n, heads, l, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    dout = torch.randn(n, heads, l, d, device="cuda", dtype=torch.bfloat16)
    allowed = torch.ones(n, 1, 1, l, device="cuda", dtype=torch.bool)
    allowed[1::2, :, :, l - 16:] = False  # bench_train's BERT mask: the last 16 tokens of every other sequence
    variants = (("bhsd", False, False, 0.0), ("packed", True, False, 0.0), ("+mask", True, True, 0.0),
                ("+dropout", True, True, 0.1))
    backends = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION))
    for name, use_packed, use_mask, p in variants:
        for backend_name, backend in backends:
            def forward():
                q, k, v = plain
                if use_packed:
                    q, k, v = (x.view(n, l, heads, d).transpose(1, 2) for x in packed.split(hidden, -1))
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, attn_mask=allowed if use_mask else None, dropout_p=p)

            def both():
                packed.grad = None
                for t in plain:
                    t.grad = None
                forward().backward(dout)

            try:
                fwd = graphed_ms(forward)
                fb = graphed_ms(both)
            except RuntimeError as e:  # the backend does not take this variant
                print(f"torch {model:<5} {n:3d} x {heads:2d} x {l} x {d}  {name:<8} {backend_name:<9} n/a "
                      f"({str(e).splitlines()[0][:80]})")
                continue
            tbs = 4.0 * n * heads * l * d * 2.0 / (fwd * 1e9)
            print(f"torch {model:<5} {n:3d} x {heads:2d} x {l} x {d}  {name:<8} {backend_name:<9} fwd {fwd:7.4f} ms "
                  f"({tbs:5.2f} TB/s)  fwd+bwd {fb:7.4f} ms  bwd {fb - fwd:7.4f} ms")


def main():
    if not torch.cuda.is_available():
        print("pytorch_attention: no GPU visible")
        return
    print(f"pytorch {torch.__version__}")
    if "--bert" in sys.argv[1:]:
        run_bert("base", 128, 12, 128, 64)
        run_bert("large", 64, 16, 128, 64)
        return
    run(128, 12, 128, 64)
    run(64, 12, 512, 64)


if __name__ == "__main__":
    main()
