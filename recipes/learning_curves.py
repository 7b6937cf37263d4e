"""BLEU and AL over training: every snapshot of a run evaluated on the validation sets.

    python recipes/learning_curves.py OUT RUN_DIR:SETTING:LABEL ... [--limit N] [--data DIR]

RUN_DIR is a `simulserve train` output with `snapshot_every` set (RUN_DIR/snapshots/stepNNNNNN,
plus RUN_DIR/checkpoint when it holds the last update's weights rather than an epoch average); SETTING is k=5,
delta=1 or empty (the model's own); LABEL names the line. The x axis is updates in total, counting those behind
the checkpoint a run started from.
Writes OUT/learning_curves.json and OUT/learning_curves.png (BLEU and SimulEval AL per
validation set). The validation sets, not the test sets: this is for watching training.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def points(run: Path) -> list[tuple[int, Path]]:
    """(total updates, checkpoint) for each snapshot and the final checkpoint, in order."""
    found, base = {}, 0
    for d in sorted((run / "snapshots").glob("step*")) + [run / "checkpoint"]:
        if (d / "config.json").is_file():
            info = json.loads((d / "config.json").read_text())["training"]
            if info.get("averaged"):  # an average of epochs is not a point of this run's curve
                continue
            # checkpoints written before init_steps was recorded count from the run's first snapshot
            base = int(info.get("init_steps", base))
            found[int(info["steps"]) + base] = d
    if not found:
        raise SystemExit(f"{run}: no snapshots/ or checkpoint/ to evaluate")
    return sorted(found.items())


def parse_run(text: str) -> tuple[str, Path, dict]:
    parts = text.split(":", 2)
    if len(parts) != 3 or not parts[0] or not parts[2]:
        raise SystemExit(f"expected RUN_DIR:SETTING:LABEL (SETTING k=N, delta=X or empty), got {text!r}")
    path, setting, label = parts
    kw = {}
    if setting:
        key, _, value = setting.partition("=")
        if key not in ("k", "delta"):
            raise SystemExit(f"{text!r}: the setting is k=N or delta=X")
        kw[key] = int(value) if key == "k" else float(value)
    return label, Path(path), kw


def evaluate(runs, data: Path, sets: list[str], limit: int) -> list[dict]:
    from tqdm import tqdm

    from agents.evaluate import data_dir_sets, display_path, read_test_set, score_results
    from models.checkpoint import load_checkpoint
    from models.step import StreamingDecoder
    from models.translate import simulate
    test_sets = [read_test_set(src, ref, name) for name, src, ref in data_dir_sets(data, ["valid"], sets, "de", "en")]
    for ts in test_sets:
        ts.sources, ts.references = ts.sources[:limit], ts.references[:limit]
    plan = [(label, steps, ckpt, kw) for label, run, kw in runs for steps, ckpt in points(run)]
    rows = []
    with tqdm(total=len(plan) * sum(len(ts.sources) for ts in test_sets), unit="sent", file=sys.stderr) as bar:
        for label, steps, ckpt, kw in plan:
            model, tok, _ = load_checkpoint(ckpt)
            decoder = StreamingDecoder(model, tok)
            for ts in test_sets:
                bar.set_description(f"{label} {steps} {ts.name}")
                scores = score_results(simulate(decoder, ts.sources, batch_size=32, progress=bar, **kw),
                                       ts.references)
                rows.append({"label": label, "updates": steps, "set": ts.name, "checkpoint": display_path(ckpt),
                             "BLEU": round(scores["BLEU"], 2), "AL": round(scores["simuleval"]["AL"], 3),
                             "sentences": scores["sentences"], **kw})
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sets = list(dict.fromkeys(r["set"] for r in rows))
    fig, axes = plt.subplots(2, len(sets), figsize=(4.2 * len(sets), 6.4), squeeze=False, sharex=True)
    for col, st in enumerate(sets):
        for label in dict.fromkeys(r["label"] for r in rows):
            mine = sorted((r for r in rows if r["set"] == st and r["label"] == label), key=lambda r: r["updates"])
            xs = [r["updates"] for r in mine]
            axes[0][col].plot(xs, [r["BLEU"] for r in mine], marker="o", label=label)
            if "k" in mine[0] or "delta" in mine[0]:  # an offline model's AL is just the sentence length
                axes[1][col].plot(xs, [r["AL"] for r in mine], marker="o", label=label)
        axes[0][col].set_title(st)
        axes[1][col].set_xlabel("updates")
    axes[0][0].set_ylabel("BLEU")
    axes[1][0].set_ylabel("AL (source words, SimulEval)")
    axes[0][0].legend(fontsize=8)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    from agents.plots import save_png
    save_png(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("runs", nargs="*", help="RUN_DIR:SETTING:LABEL, e.g. runs/waitk_continue:k=5:wait-k k=5")
    ap.add_argument("--data", type=Path, default=Path("data/de-en"))
    ap.add_argument("--sets", default="bible,libreoffice,ddtp")
    ap.add_argument("--limit", type=int, default=200, help="sentences per validation set (default 200)")
    ap.add_argument("--replot", action="store_true", help="only redraw OUT/learning_curves.png from its json")
    args = ap.parse_args(argv)
    if args.replot:
        rows = json.loads((args.out / "learning_curves.json").read_text())
    else:
        rows = evaluate([parse_run(r) for r in args.runs], args.data, args.sets.split(","), args.limit)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "learning_curves.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    plot(rows, args.out / "learning_curves.png")
    for r in rows:
        print(f"{r['label']:<14} {r['updates']:>6} {r['set']:<18} BLEU {r['BLEU']:6.2f}  AL {r['AL']:6.3f}")
    print(f"wrote {args.out / 'learning_curves.json'}, {args.out / 'learning_curves.png'}")


if __name__ == "__main__":
    main()
