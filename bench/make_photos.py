"""Builds a folder of real-photo JPEGs for bench_images and bench/pytorch_images.py, without network.

    python3 bench/make_photos.py /tmp/photos             # 240 JPEGs, ~500 x 350, quality 90
    python3 bench/make_photos.py /tmp/photos --count 480

The photos come from the sample images that ship inside Python packages: scikit-learn's
load_sample_images() (china.jpg, flower.jpg) and scikit-image's data module (astronaut, coffee, chelsea,
rocket, motorcycle, ...), matplotlib's sample_data (grace_hopper.jpg) and scipy's face, whichever are
installed; else any JPEG/PNG of at least 200 x 200 found inside site-packages; plus the photos of
--sources DIR (at least one source is needed). Each output is a random
crop (30-100% of the source's area, aspect ratio 0.6-1.7) of a random source, resized to about 500 x 350
(landscape or portrait, +-15%), saved with quality 90 and 4:2:0 chroma (PIL's default), as typical ImageNet
photos. The layout is an ImageFolder: class_0 .. class_3, files img_0000.jpg, ...; a photo's class is its
source's (source k in class k mod 4; fewer classes where there are fewer sources), so a model can learn the
labels and a training run's loss falls.
"""
import argparse
import os
import random
import sys

import numpy as np
from PIL import Image


def from_files(paths, limit=20):
    found = []
    for path in paths:
        try:
            img = np.asarray(Image.open(path).convert("RGB"))
        except Exception:  # noqa: BLE001  (not an image PIL reads)
            continue
        if min(img.shape[:2]) >= 200:
            found.append((os.path.basename(path), img))
        if len(found) >= limit:
            break
    return found


def site_package_photos():
    import site
    roots = site.getsitepackages() + [site.getusersitepackages()]
    paths = []
    for root in roots:
        for dirpath, _, files in os.walk(root):
            paths += [os.path.join(dirpath, f) for f in sorted(files)
                      if f.lower().endswith((".jpg", ".jpeg", ".png")) and
                      os.path.getsize(os.path.join(dirpath, f)) > 20000]
    return from_files(sorted(paths))


def sources(extra):
    found = []
    if extra:
        found += from_files(sorted(os.path.join(extra, f) for f in os.listdir(extra)), limit=1000)
    try:
        from sklearn.datasets import load_sample_images
        for name, img in zip(["china", "flower"], load_sample_images().images):
            found.append((name, np.asarray(img)))
    except Exception as e:  # noqa: BLE001  (any missing or broken package: skip it)
        print(f"make_photos: scikit-learn sample images unavailable ({e})", file=sys.stderr)
    try:
        import skimage.data as d
        for name in ["astronaut", "coffee", "chelsea", "rocket", "motorcycle", "hubble_deep_field",
                     "immunohistochemistry", "retina", "cat", "colorwheel"]:
            try:
                if name == "motorcycle":
                    img = d.stereo_motorcycle()[0]
                else:
                    img = getattr(d, name)()
            except Exception:  # noqa: BLE001  (not bundled: would need a download)
                continue
            img = np.asarray(img)
            if img.ndim == 3 and img.shape[2] >= 3 and min(img.shape[:2]) >= 200:
                found.append((name, img[:, :, :3].astype(np.uint8)))
    except Exception as e:  # noqa: BLE001
        print(f"make_photos: scikit-image sample images unavailable ({e})", file=sys.stderr)
    try:
        import matplotlib.cbook
        with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
            found.append(("grace_hopper", np.asarray(Image.open(f).convert("RGB"))))
    except Exception:  # noqa: BLE001
        pass
    try:
        try:
            from scipy.datasets import face
        except ImportError:
            from scipy.misc import face
        found.append(("face", np.asarray(face())))
    except Exception:  # noqa: BLE001  (scipy.datasets downloads; only a cached copy works offline)
        pass
    if not found:
        found = site_package_photos()
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--count", type=int, default=240)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sources", help="a folder of photos to crop from, besides the packages' samples")
    args = p.parse_args()
    imgs = sources(args.sources)
    if not imgs:
        sys.exit("make_photos: no sample photos found: install scikit-learn or scikit-image, or pass --sources DIR")
    print(f"make_photos: sources {', '.join(f'{n} {a.shape[1]}x{a.shape[0]}' for n, a in imgs)}", file=sys.stderr)
    rng = random.Random(args.seed)
    args.classes = min(args.classes, len(imgs))  # every class holds photos of its own sources
    for c in range(args.classes):
        os.makedirs(os.path.join(args.folder, f"class_{c}"), exist_ok=True)
    for i in range(args.count):
        source = i % len(imgs)
        name, src = imgs[source]
        h, w = src.shape[:2]
        for _ in range(20):
            area = h * w * rng.uniform(0.3, 1.0)
            ratio = rng.uniform(0.6, 1.7)
            cw, ch = int(round((area * ratio) ** 0.5)), int(round((area / ratio) ** 0.5))
            if cw <= w and ch <= h:
                break
        else:
            cw, ch = w, h
        top, left = rng.randint(0, h - ch), rng.randint(0, w - cw)
        crop = Image.fromarray(src[top:top + ch, left:left + cw])
        long_side, short_side = int(500 * rng.uniform(0.85, 1.15)), int(350 * rng.uniform(0.85, 1.15))
        size = (long_side, short_side) if rng.random() < 0.75 else (short_side, long_side)  # (width, height)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        out = crop.resize(size, Image.BICUBIC)
        out.save(os.path.join(args.folder, f"class_{source % args.classes}", f"img_{i:04d}.jpg"), quality=90)
    print(f"make_photos: {args.count} JPEGs in {args.folder} ({args.classes} classes)", file=sys.stderr)


if __name__ == "__main__":
    main()
