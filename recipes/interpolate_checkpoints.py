"""Weight-space interpolation of two checkpoints of one architecture (e.g. shipped and fine-tuned).

    python recipes/interpolate_checkpoints.py BEFORE AFTER OUT [--weight 0.5]

OUT = (1 - w) * BEFORE + w * AFTER, tensor by tensor, in BEFORE's dtype; config.json is
BEFORE's with both members listed under `training.weight_average`, spm.model BEFORE's (they must
share the vocabulary). Interpolating a fine-tuned model back towards its start keeps much of what
fine-tuning gained while forgetting less. The two-member case of recipes/average_checkpoints.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from average_checkpoints import write  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--weight", type=float, default=0.5, help="weight of AFTER (default 0.5)")
    args = p.parse_args()
    print(f"wrote {write(args.out, [args.before, args.after], [1 - args.weight, args.weight])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
