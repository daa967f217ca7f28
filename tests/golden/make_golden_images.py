"""Golden values for kiln's image transforms (tests/data/test_transforms.cpp, TransformsGolden), from torchvision.

    python3 tests/golden/make_golden_images.py tests/golden/data

Writes image_transforms.golden (format: tests/golden/make_golden.py). The input is a fixed random uint8 image
(torch.manual_seed(0), 3 x 37 x 53), stored as `input` in (H, W, C) order as kiln's images. Every uint8
output is stored (H, W, C) too: torchvision.transforms.v2.functional.resize(antialias=True, bilinear) to
several sizes (down, up, mixed, one dim only, shorter side 24), resized_crop, center_crop (inside and
padded); `normalize_imagenet` is to_dtype(float32, scale=True) then normalize with ImageNet's mean/std, (C, H, W).
"""
import os
import sys

import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import write  # noqa: E402  (one writer of the format)


def hwc(t):
    return t.permute(1, 2, 0).contiguous()


def main(path):
    torch.manual_seed(0)
    img = torch.randint(0, 256, (3, 37, 53), dtype=torch.uint8)
    bilinear = InterpolationMode.BILINEAR
    out = {"input": hwc(img)}
    for h, w in [(16, 20), (64, 90), (50, 30), (37, 26), (5, 7)]:
        out[f"resize_{h}x{w}"] = hwc(F.resize(img, [h, w], interpolation=bilinear, antialias=True))
    out["resize_short_24"] = hwc(F.resize(img, [24], interpolation=bilinear, antialias=True))
    out["resized_crop_5_7_25_30_12x18"] = hwc(
        F.resized_crop(img, 5, 7, 25, 30, [12, 18], interpolation=bilinear, antialias=True))
    out["center_crop_20x30"] = hwc(F.center_crop(img, [20, 30]))
    out["center_crop_40x56"] = hwc(F.center_crop(img, [40, 56]))
    x = F.to_dtype(img, torch.float32, scale=True)
    out["normalize_imagenet"] = F.normalize(x, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    write(path, "image_transforms", out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "data"))
