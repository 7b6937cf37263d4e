"""Sentence ends found by the boundary classifier and by punctuation alone on the test talks (docs/evaluation.md).

    python recipes/segmenter_scores.py [DATA] [SEGMENTER_DIR]

Every document of every test set is one stream; a found end counts when the reference sentence ends
there (the end of the stream is not counted).
"""
from __future__ import annotations

import sys
from pathlib import Path

from models.sentence_boundary import boundary_scores, load_boundary_model
from models.sentence_cutter import cut_stream
from models.training.segmenter import valid_streams

SETS = ["everyday", "unseen", "dialogue", "bible", "ddtp", "libreoffice"]


def main(data: str = "data/de-en-everyday", model_dir: str | None = None) -> None:
    model = load_boundary_model(model_dir)
    print("| test set | talks | sentence ends | punct P | R | F1 | boundary P | R | F1 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in SETS:
        streams = valid_streams(Path(data), [name], "de", split="test")[name]
        p = boundary_scores(streams, lambda w: cut_stream(w, None))
        b = boundary_scores(streams, lambda w: cut_stream(w, model))
        print(f"| {name} | {len(streams)} | {b['boundaries']} | {p['precision']:.3f} | {p['recall']:.3f} | "
              f"{p['f1']:.3f} | {b['precision']:.3f} | {b['recall']:.3f} | {b['f1']:.3f} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
