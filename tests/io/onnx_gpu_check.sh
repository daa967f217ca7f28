#!/usr/bin/env bash
# tests/io/onnx_gpu_check.sh BUILD OUT: on a GPU machine, exports ResNet-50 and BERT-base from GPU-resident models
# (onnx_models --gpu) and compares ONNX Runtime's CPU run of each with kiln's GPU eval outputs: float32 with TF32
# products within 1e-2 relative to the output's scale, bf16 autocast within 5e-2. Needs python3 with onnx and
# onnxruntime (third_party/python from scripts/setup.sh, or the machine's own).
set -euo pipefail
build="${1:?usage: onnx_gpu_check.sh BUILD OUT}"
out="${2:?usage: onnx_gpu_check.sh BUILD OUT}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$out" && mkdir -p "$out"
"$build/tests/onnx_models" --gpu "$out"
check=(python3 "$here/onnx_check.py")
"${check[@]}" --rtol 1e-2 --atol-scale 1e-2 "$out/resnet50_tf32" "$out/bert_base_tf32"
"${check[@]}" --rtol 5e-2 --atol-scale 5e-2 "$out/resnet50_bf16" "$out/bert_base_bf16"
