"""The issue's three targets, checked on an `evaluate` results.json (SimulEval convention, words).

    python recipes/targets.py docs/results/results.json

1. GMA above wait-k: at each GMA point, wait-k's BLEU interpolated linearly at the same AL
   (only where wait-k has points within ±0.5 AL on both sides or one within ±0.5).
2. GMA at δ=1 streams: CW ≤ 2.
3. GMA reaches ≥ 85% of offline BLEU at AL ≤ 5 words (the best GMA point with AL ≤ 5,
   against the best offline row: beam search where it was evaluated).
"""
from __future__ import annotations

import json
import sys


def waitk_bleu_at(points: list[tuple[float, float]], al: float) -> float | None:
    """wait-k BLEU at `al`: linear between the two neighbouring k, or the nearest point within 0.5."""
    points = sorted(points)
    for (a0, b0), (a1, b1) in zip(points, points[1:]):
        if a0 <= al <= a1 and a1 > a0:
            return b0 + (b1 - b0) * (al - a0) / (a1 - a0)
    near = [b for a, b in points if abs(a - al) <= 0.5]
    return near[0] if near else None


def main(path: str) -> None:
    d = json.loads(open(path, encoding="utf-8").read())
    rows = d["results"]
    for st in dict.fromkeys(r["set"] for r in rows):
        mine = [r for r in rows if r["set"] == st]
        wk = [(r["simuleval"]["AL"], r["BLEU"]) for r in mine if r["policy"] == "waitk"]
        # the offline reference is its best decoding (beam search where it was run)
        off = max((r["BLEU"] for r in mine if r["policy"] == "offline"), default=None)
        print(f"{st}:")
        for r in (r for r in mine if r["policy"] == "gma"):
            al, bleu, cw = r["simuleval"]["AL"], r["BLEU"], r["simuleval"]["CW"]
            ref = waitk_bleu_at(wk, al)
            vs = "no wait-k point within reach" if ref is None else f"wait-k at that AL {ref:.2f} ({bleu - ref:+.2f})"
            share = f", {100 * bleu / off:.0f}% of offline" if off else ""
            print(f"  {r['label']} {r['setting']}: AL {al:.2f} BLEU {bleu:.2f} CW {cw:.2f}; {vs}{share}")
        low = [r for r in mine if r["policy"] == "gma" and r["simuleval"]["AL"] <= 5]
        if off:
            best = max(low, key=lambda r: r["BLEU"]) if low else None
            print(f"  offline BLEU {off:.2f}; best GMA with AL <= 5: "
                  + (f"{best['BLEU']:.2f} ({100 * best['BLEU'] / off:.0f}%)" if best else "none"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/results/results.json")
