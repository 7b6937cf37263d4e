"""Weight-space interpolation of two checkpoints of one architecture (e.g. shipped and fine-tuned).

    python recipes/interpolate_checkpoints.py BEFORE AFTER OUT [--weight 0.5]

OUT = (1 - w) * BEFORE + w * AFTER, tensor by tensor, in BEFORE's dtype; config.json is
AFTER's and spm.model BEFORE's (they must share the vocabulary). Interpolating a fine-tuned
model back towards its start keeps much of what fine-tuning gained while forgetting less.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--weight", type=float, default=0.5, help="weight of AFTER (default 0.5)")
    args = p.parse_args()
    if (args.before / "spm.model").read_bytes() != (args.after / "spm.model").read_bytes():
        raise SystemExit("error: the two checkpoints use different vocabularies")
    a = load_file(str(args.before / "model.safetensors"))
    b = load_file(str(args.after / "model.safetensors"))
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        raise SystemExit("error: the two checkpoints have different tensors")
    w = args.weight
    mixed = {k: ((1 - w) * a[k].float() + w * b[k].float()).to(a[k].dtype) if a[k].is_floating_point() else a[k]
             for k in a}
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(mixed, str(args.out / "model.safetensors"))
    shutil.copyfile(args.after / "config.json", args.out / "config.json")
    shutil.copyfile(args.before / "spm.model", args.out / "spm.model")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
