"""BLEU (AL) per source of a pooled test set, from the per-sentence outputs `simulserve evaluate` wrote.

    python recipes/per_source_table.py docs/results data/de-en-everyday            # dialogue by game
    python recipes/per_source_table.py runs/unseen_gma data/de-en-everyday unseen # unseen: naev, tuxpaint

The pooled `test.dialogue` set is the freedroid, hedgewars and wesnoth test sets one after the other
(models/data/prepare.py EVAL_SETS); each output file RESULTS/outputs/test.dialogue/*.jsonl is cut at the
same lines (its German checked line by line) and every part scored with the code `evaluate` uses.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agents.evaluate import score_results  # noqa: E402
from models.data.prepare import EVAL_SETS  # noqa: E402
from models.translate import SentenceResult  # noqa: E402


def read_outputs(path: Path) -> tuple[list[SentenceResult], list[str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    refs = [r.pop("reference") for r in rows]
    return [SentenceResult(**r) for r in rows], refs


def source_lines(data: Path, pooled: str, source: str) -> list[str]:
    """test.SOURCE.de; a test-only source (the unseen set) has none, so its lines are cut out of
    test.POOLED.de by the manifest's counts (the sources are pooled in EVAL_SETS order)."""
    path = data / f"test.{source}.de"
    if path.exists():
        return path.read_text(encoding="utf-8").splitlines()
    counts = json.loads((data / "manifest.json").read_text(encoding="utf-8"))["counts"]
    start = sum(counts[s]["test"] for s in EVAL_SETS[pooled][:EVAL_SETS[pooled].index(source)])
    pooled_lines = (data / f"test.{pooled}.de").read_text(encoding="utf-8").splitlines()
    return pooled_lines[start:start + counts[source]["test"]]


def split_by_source(results: list[SentenceResult], refs: list[str], data: Path, pooled: str
                    ) -> dict[str, tuple[list[SentenceResult], list[str]]]:
    """{source: (its results, its references)}, cut where the pooled set's parts end."""
    out, start = {}, 0
    for source in EVAL_SETS[pooled]:
        german = source_lines(data, pooled, source)
        part = results[start:start + len(german)]
        if [r.source for r in part] != german:
            raise SystemExit(f"the outputs do not follow {data}/test.{source}.de from line {start + 1}")
        out[source] = (part, refs[start:start + len(german)])
        start += len(german)
    if start != len(results):
        raise SystemExit(f"{len(results) - start} output lines are in no source of {pooled}")
    return out


def main(argv: list[str]) -> None:
    results_dir, data = Path(argv[0]), Path(argv[1])
    pooled = argv[2] if len(argv) > 2 else "dialogue"
    sources = EVAL_SETS[pooled]
    print(f"| model.setting | {pooled} (all) | " + " | ".join(sources) + " |")
    print("|---|" + "---:|" * (len(sources) + 1))
    for path in sorted((results_dir / "outputs" / f"test.{pooled}").glob("*.jsonl")):
        results, refs = read_outputs(path)
        cells = []
        for part, part_refs in [(results, refs), *split_by_source(results, refs, data, pooled).values()]:
            s = score_results(part, part_refs)
            cells.append(f"{s['BLEU']:.2f} ({s['simuleval']['AL']:.2f})")
        print(f"| {path.stem} | " + " | ".join(cells) + " |")
    print("\nBLEU (SimulEval AL in source words); sentences: " +
          ", ".join(f"{s} {len(source_lines(data, pooled, s))}" for s in sources))


if __name__ == "__main__":
    main(sys.argv[1:])
