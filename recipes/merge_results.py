"""Merge `simulserve evaluate` runs made in parts (side by side, each into its own directory) into one
results directory, the way `--append` merges: a later part's row replaces an earlier one of the same set,
model and setting; per-sentence outputs are copied; tables, CSV and plots are rewritten.

    python recipes/merge_results.py docs/results runs/res/gma runs/res/waitk runs/res/offline
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents.evaluate import merge_previous, write_outputs  # noqa: E402


def main(out: str, *parts: str) -> None:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").unlink(missing_ok=True)
    for part in map(Path, parts):
        d = json.loads((part / "results.json").read_text(encoding="utf-8"))
        rows, meta = merge_previous(out_dir / "results.json", d.pop("results"), d)
        write_outputs(out_dir, rows, meta)
        if (part / "outputs").is_dir() and part.resolve() != out_dir.resolve():
            shutil.copytree(part / "outputs", out_dir / "outputs", dirs_exist_ok=True)
    print(f"merged {len(parts)} parts into {out_dir / 'results.json'}: {len(rows)} rows")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
