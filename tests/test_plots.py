"""agents/plots.py save_png: a figure stored as matplotlib draws it (in 256 colours, each pixel within a few levels)
when every pixel is opaque, in less than half the bytes of matplotlib's own PNG; a transparent one keeps its alpha."""
from __future__ import annotations

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import numpy as np
from PIL import Image

from agents.plots import save_png


def figure(transparent: bool = False) -> Figure:
    fig = Figure(figsize=(5, 3))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for i in range(4):
        ax.plot(range(30), [(x * (i + 1)) % 17 for x in range(30)], marker="o", label=f"curve {i}")
    ax.legend()
    ax.grid(alpha=0.3)
    if transparent:
        fig.patch.set_alpha(0.0)
    return fig


def test_save_png_keeps_the_picture_in_fewer_bytes(tmp_path):
    fig = figure()
    plain = io.BytesIO()
    fig.savefig(plain, format="png", dpi=100)
    path = save_png(fig, tmp_path / "sub" / "plot.png", dpi=100)
    mine = Image.open(path)
    mine.load()
    theirs = Image.open(io.BytesIO(plain.getvalue()))
    theirs.load()
    assert mine.mode == "P" and theirs.mode == "RGBA" and mine.size == theirs.size
    diff = np.abs(np.asarray(mine.convert("RGB"), dtype=int) - np.asarray(theirs.convert("RGB"), dtype=int))
    assert diff.max() <= 16 and diff.mean() < 1, (diff.max(), diff.mean())   # (levels of 255)
    assert path.stat().st_size < 0.5 * len(plain.getvalue())


def test_save_png_keeps_a_real_alpha_channel(tmp_path):
    path = save_png(figure(transparent=True), tmp_path / "clear.png", dpi=60)
    image = Image.open(path)
    assert image.mode == "RGBA" and image.getchannel("A").getextrema()[0] < 255
