"""Training and validation loss of runs that came back from the GPU machine (or any `simulserve train`
output): OUTPUT/updates.jsonl (the mean loss of every 20 updates) and OUTPUT/log.jsonl (validation loss
at each epoch end), one line per run, in one picture.

    python recipes/gpu/train_curves.py OUT.png RUN_DIR:LABEL [RUN_DIR:LABEL ...]

Writes OUT.png and OUT.json (per run: the epoch ends with their update and validation loss, and the
last window's training loss). Training loss is label-smoothed and dropout is on, so it sits above the
validation loss; the shape, not the level, is what to compare.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def curves(run: Path) -> dict:
    updates, epochs = read_jsonl(run / "updates.jsonl"), read_jsonl(run / "log.jsonl")
    if not updates and not epochs:
        raise SystemExit(f"{run}: neither updates.jsonl nor log.jsonl (a `simulserve train` output?)")
    return {"train": [(u["step"], u["loss"]) for u in updates],
            "valid": [(e["step"], e["valid_loss"]) for e in epochs if e.get("valid_loss") is not None]}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, runs = Path(argv[0]), []
    for spec in argv[1:]:
        path, _, label = spec.partition(":")
        runs.append((label or Path(path).name, curves(Path(path))))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (label, c) in enumerate(runs):
        color = f"C{i}"
        if c["train"]:
            ax.plot(*zip(*c["train"]), color=color, alpha=0.45, lw=1, label=f"{label}: training (per 20 updates)")
        if c["valid"]:
            ax.plot(*zip(*c["valid"]), "o-", color=color, lw=2, label=f"{label}: validation (epoch ends)")
    ax.set_xlabel("updates in this run")
    ax.set_ylabel("loss per target token")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # (run by path: the project's plotting helper)
    from agents.plots import save_png
    save_png(fig, out, dpi=120)
    summary = {label: {"epoch_ends": [{"step": s, "valid_loss": round(v, 4)} for s, v in c["valid"]],
                       "last_train_loss": c["train"][-1][1] if c["train"] else None} for label, c in runs}
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
