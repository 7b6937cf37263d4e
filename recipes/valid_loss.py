"""Validation loss of checkpoints on a data directory's valid split (per source too), without decoding:
a way to choose among candidate weights that leaves every test set, `unseen` above all, untouched.

    python recipes/valid_loss.py --data data/de-en-widelands CKPT [CKPT...]

Prints one row per checkpoint: the loss per target token (no label smoothing; GMA at the model's own δ,
wait-k at its default k) on valid.de/en and on each valid.SOURCE.de/en that exists.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.checkpoint import load_checkpoint  # noqa: E402
from models.training.data_loading import encode_pairs, read_parallel  # noqa: E402
from models.training.train import validation_loss  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--data", required=True, help="a prepare-data directory with valid.de/en")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    data = Path(args.data)
    if not (data / "valid.de").exists():
        print(f"no {data}/valid.de: run simulserve prepare-data first", file=sys.stderr)
        return 2
    splits = {"all": read_parallel(data / "valid", "de", "en")}
    for de in sorted(data.glob("valid.*.de")):
        name = de.name[len("valid."):-len(".de")]
        if (data / f"valid.{name}.en").exists():
            splits[name] = read_parallel(data / f"valid.{name}", "de", "en")
    print("| checkpoint | " + " | ".join(f"{n} ({len(v)})" for n, v in splits.items()) + " |")
    print("|---|" + "---:|" * len(splits))
    for ckpt in args.checkpoints:
        model, tok, _ = load_checkpoint(ckpt)
        cfg = model.cfg
        model.float().eval()
        losses = [validation_loss(model, cfg, encode_pairs(pairs, tok, cfg.max_positions), 4096)
                  for pairs in splits.values()]
        print(f"| {ckpt} | " + " | ".join(f"{x:.4f}" for x in losses) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
