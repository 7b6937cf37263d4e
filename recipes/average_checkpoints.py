"""Weight average of checkpoints of one architecture and vocabulary (a "model soup": fine-tunes from the
same start, e.g. one recipe run with several seeds).

    python recipes/average_checkpoints.py OUT CKPT CKPT [CKPT ...] [--weights 0.5,0.25,0.25]

OUT = Σ w_i · CKPT_i tensor by tensor (uniform weights unless given; they must sum to 1), computed in
float32 and stored in the first checkpoint's dtype. config.json is the first checkpoint's with
`training.weight_average` listing every member (path, weight, its own updates and seed), so the saved
config says how the weights were made; spm.model is the first's. Fine-tunes of one start differ mostly
by the draw of batches and δs; their average keeps what they share and evens out what they do not.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.tokenizer import Tokenizer, vocabulary_difference  # noqa: E402


def average(checkpoints: list[Path], weights: list[float]) -> dict:
    """The weighted sum of the checkpoints' tensors (non-float tensors, if any, from the first)."""
    if len(checkpoints) != len(weights) or len(checkpoints) < 2:
        raise SystemExit("error: give at least two checkpoints and one weight per checkpoint")
    if abs(sum(weights) - 1.0) > 1e-6:
        raise SystemExit(f"error: the weights sum to {sum(weights)}, not 1")
    states, vocab = [], None
    for c in checkpoints:
        if not (c / "model.safetensors").is_file() or not (c / "spm.model").is_file():
            raise SystemExit(f"error: {c} is not a checkpoint directory (no model.safetensors or spm.model)")
        vocab = vocab or Tokenizer(checkpoints[0] / "spm.model")
        why = vocabulary_difference(Tokenizer(c / "spm.model"), vocab)
        if why:
            raise SystemExit(f"error: {c} uses another vocabulary than {checkpoints[0]} ({why})")
        states.append(load_file(str(c / "model.safetensors")))
    first = states[0]
    for c, s in zip(checkpoints[1:], states[1:]):
        if s.keys() != first.keys() or any(s[k].shape != first[k].shape for k in first):
            raise SystemExit(f"error: {c} has other tensors than {checkpoints[0]}")
    return {k: sum(w * s[k].float() for w, s in zip(weights, states)).to(first[k].dtype)
            if first[k].is_floating_point() else first[k] for k in first}


def write(out: Path, checkpoints: list[Path], weights: list[float]) -> Path:
    mixed = average(checkpoints, weights)
    meta = json.loads((checkpoints[0] / "config.json").read_text(encoding="utf-8"))
    members = []
    for c, w in zip(checkpoints, weights):
        training = json.loads((c / "config.json").read_text(encoding="utf-8")).get("training", {})
        members.append({"checkpoint": str(c), "weight": w, "steps": training.get("steps"),
                        "init_steps": training.get("init_steps"),
                        "seed": (training.get("train_config") or {}).get("seed")})
    meta.setdefault("training", {})["weight_average"] = members
    out.mkdir(parents=True, exist_ok=True)
    save_file(mixed, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    shutil.copyfile(checkpoints[0] / "spm.model", out / "spm.model")
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("checkpoints", type=Path, nargs="+")
    p.add_argument("--weights", help="comma-separated, one per checkpoint (default: uniform)")
    args = p.parse_args(argv)
    n = len(args.checkpoints)
    weights = [float(w) for w in args.weights.split(",")] if args.weights else [1.0 / n] * n
    print(f"wrote {write(args.out, args.checkpoints, weights)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
