"""Matplotlib figures of the evaluation: BLEU–latency curves and attention/alignment maps.

Figures are built with the object API and rendered by the Agg canvas
explicitly, so nothing here touches pyplot's global state or needs a display
(safe inside a server process or a test run).
"""
from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

MARKERS = {"gma": "o", "waitk": "s", "offline": "*"}


def save_png(fig, path: str | Path, dpi: int = 120, **savefig) -> Path:
    """The figure as a PNG, stored small: rendered by Agg, then, where every pixel is opaque, in 256 colours
    (Pillow's max-coverage palette, no dithering: a line plot's 1,000-3,000 colours are anti-aliased edges, which
    move by at most a few levels; the docs' plots came out 13/255 apart at most) and compressed with `optimize`:
    less than half the bytes of the full-colour image. A figure with real transparency keeps its colours and
    alpha. The docs' plots travel with the tree to a GPU machine, whose share is capped (tests/test_tree_size.py)."""
    from PIL import Image
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, **savefig)
    image = Image.open(buf)
    image.load()
    if image.mode == "RGBA" and image.getchannel("A").getextrema() == (255, 255):
        image = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MAXCOVERAGE,
                                              dither=Image.Dither.NONE)
    image.save(path, format="PNG", optimize=True, **({"dpi": image.info["dpi"]} if "dpi" in image.info else {}))
    return path


def _save(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    return save_png(fig, path, dpi=dpi, bbox_inches="tight")


def bleu_latency_plot(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """BLEU against AL, one curve per label (points sorted by AL), one-point labels as markers.

    Each row: {"label", "policy", "setting", "BLEU", "AL" (SimulEval words),
    "paper_AL" (GMA paper: subwords with EOS)}. Two panels, one per convention.
    """
    fig = Figure(figsize=(11, 4.4))
    axes = fig.subplots(1, 2)
    panels = [("AL", "AL (source words, SimulEval convention)"),
              ("paper_AL", "AL (source subwords + EOS, GMA paper convention)")]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    colors = matplotlib.colormaps["tab10"]
    for ax, (key, xlabel) in zip(axes, panels):
        for c, label in enumerate(labels):
            pts = sorted((r for r in rows if r["label"] == label and _finite(r.get(key))),
                         key=lambda r: r[key])
            if not pts:
                continue
            policy = pts[0]["policy"]
            xs, ys = [r[key] for r in pts], [r["BLEU"] for r in pts]
            style = dict(color=colors(c % 10), marker=MARKERS.get(policy, "o"), label=label)
            if len(pts) == 1:
                ax.plot(xs, ys, linestyle="none", markersize=8 if _has_knob(policy) else 13, **style)
            else:
                ax.plot(xs, ys, linewidth=1.8, markersize=6, **style)
            for r in pts:
                ax.annotate(r["setting"], (r[key], r["BLEU"]), textcoords="offset points",
                            xytext=(4, 4), fontsize=7, color=style["color"])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("BLEU (sacrebleu)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def _has_knob(policy: str) -> bool:
    """The policy has a latency setting (a curve), unlike offline (one point, drawn larger)."""
    from models.policies import policy_named
    cls = policy_named(policy)
    return cls.has_k or cls.has_delta


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def alignment_plot(path: str | Path, panels: list[dict], source_labels: list[str],
                   target_labels: list[str], delays: list[int], title: str = "") -> Path:
    """Cross-attention heatmaps (target tokens × source positions) with the READ/WRITE path.

    panels: one per decoder layer shown, each {"name", "matrix" (rows × cols, None
    for positions the decoder could not see), "p" (per row, GMA's predicted
    position, or None)}. delays[i]: source positions read when target token i
    was written; the path runs right (READ) along the top of each row up to
    d_i, then down (WRITE) -- the boundary of what each target token could see.
    """
    rows, cols = len(target_labels), len(source_labels)
    w = min(4 + 0.38 * cols, 13) * len(panels)
    h = min(2.5 + 0.34 * rows, 14)
    fig = Figure(figsize=(w, h))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad="#eeeeee")  # grey: not visible at that step
    path_x, path_y = [-0.5], [-0.5]
    for i, d in enumerate(delays):
        path_x += [d - 0.5, d - 0.5]
        path_y += [i - 0.5, i + 0.5]
    image = None
    for ax, panel in zip(axes, panels):
        data = [[math.nan if v is None else v for v in row] for row in panel["matrix"]]
        image = ax.imshow(data, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.plot(path_x, path_y, color="#d62728", linewidth=2.0, label="READ → / WRITE ↓")
        ps = panel.get("p")
        if ps and any(p is not None for p in ps):
            pts = [(p, i) for i, p in enumerate(ps) if p is not None]
            ax.scatter([p for p, _ in pts], [i for _, i in pts], marker="x", s=46, color="#ff7f0e",
                       linewidths=2.0, zorder=3, label="GMA predicted position $p_i$")
        ax.set_xticks(range(cols))
        ax.set_xticklabels(source_labels, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(rows))
        ax.set_yticklabels(target_labels, fontsize=8)
        ax.set_xlim(-0.5, cols - 0.5)
        ax.set_ylim(rows - 0.5, -0.5)
        ax.set_xlabel("source subwords (received)")
        ax.set_ylabel("target subwords (written)")
        ax.set_title(panel["name"], fontsize=10)
        ax.legend(fontsize=7, loc="upper right", framealpha=0.85)
    if image is not None:
        fig.colorbar(image, ax=list(axes), fraction=0.03, pad=0.02, label="cross-attention (head mean)")
    if title:
        fig.suptitle(title)
    return _save(fig, path)
