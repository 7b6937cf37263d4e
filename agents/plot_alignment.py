"""`simulserve plot-alignment`: one sentence's cross-attention, GMA's p_i and the READ/WRITE path.

The sentence is translated word by word by `models.translate.simulate` with
`record=True`; for every written target token the decoder records, per layer,
the head-averaged cross-attention over the source it could see, GMA's predicted
position p_i and the visible count n_i. The figure (as in the GMA paper's
attention figure) shows that matrix (positions the decoder could not see are
grey), p_i as crosses and the READ/WRITE path as a staircase: right = READ a
source subword, down = WRITE a target subword.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from models.errors import UserError


class AlignmentError(UserError):
    pass


def alignment_data(decoder, sentence: str, k=None, delta=None) -> dict:
    """Run the sentence and collect what the plot shows (also written with --json)."""
    from models.translate import simulate

    if not sentence or not sentence.strip():
        raise AlignmentError("--sentence is empty")
    results, states = simulate(decoder, [sentence], k=k, delta=delta, record=True)
    r, s = results[0], states[0]
    tok, eos = decoder.tok, decoder.cfg.eos_id

    def piece(i: int) -> str:
        return "</s>" if i == eos else tok.sp.id_to_piece(i)

    def labelled(ids: list[int], unknown: list[str]) -> list[str]:
        """Pieces as axis labels, each <unk> as the characters it stands for (as the words are written)."""
        texts = iter(unknown)
        return [(next(texts, "") or UNK_LABEL) if i == tok.unk_id else piece(i) for i in ids]

    rows = len(s.record)  # a length-capped final EOS is written without a decoder step
    layers = len(s.record[0]["attention"]) if rows else 0
    cols = s.available
    matrices = []
    for layer in range(layers):
        matrix = []
        for rec in s.record:
            att = rec["attention"][layer]
            matrix.append([att[j] if j < len(att) else None for j in range(cols)])
        matrices.append(matrix)
    return {
        "sentence": sentence,
        "translation": r.prediction,
        "policy": s.policy.describe(),
        "source_pieces": labelled(s.source_tokens, [run.text for run in s.source_unknown])
        + (["</s>"] if s.source_finished else []),
        "target_pieces": labelled(s.target_tokens[:rows],
                                  target_unknown(tok, s.target_tokens[:rows], s.source_unknown)),
        "token_delays": s.token_delays[:rows],
        "word_delays": r.delays,
        "attention": matrices,  # [layer][target][source], None = not visible
        "p": [[rec["p"][layer] if rec["p"] is not None else None for rec in s.record]
              for layer in range(layers)],
        "n": [[rec["n"][layer] for rec in s.record] for layer in range(layers)],
    }


UNK_LABEL = "<unk>"   # a piece outside the vocabulary with no characters of the source to stand for


def target_unknown(tok, ids: list[int], runs) -> list[str]:
    """What each <unk> of the target pieces `ids` copied of the source's unknown `runs`, word by word as the
    streaming loop releases words (Tokenizer.word_text)."""
    used = set()
    return [text for word in tok.word_groups(ids) for text in tok.copy_unknown(word, runs, used)]


def register(sub) -> None:
    p = sub.add_parser("plot-alignment",
                       help="heatmap of one sentence's cross-attention with GMA's p_i and the READ/WRITE path",
                       description="Translate one sentence word by word and draw each layer's cross-attention, "
                                   "GMA's predicted positions and the READ/WRITE path.",
                       epilog="examples:\n"
                              "  simulserve plot-alignment -m gma_delta1 -s 'Am Anfang schuf Gott Himmel und Erde .' "
                              "-o gma.png\n"
                              "  simulserve plot-alignment -m waitk --k 3 -s 'Das Haus ist alt .' --layer all "
                              "-o waitk.png --json waitk.json",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", "-m", help="checkpoint directory or shipped model name (default gma_delta1)")
    p.add_argument("--sentence", "-s", required=True, help="the source sentence (words separated by spaces)")
    p.add_argument("--k", type=int, help="wait-k lag (wait-k models)")
    p.add_argument("--delta", type=float, help="GMA offset δ (GMA models)")
    p.add_argument("--layer", default="last",
                   help="decoder layer to show: an index (0-based, negative from the top), 'last' or 'all'")
    p.add_argument("--output", "-o", required=True, help="PNG file")
    p.add_argument("--json", help="also write the plotted numbers to this JSON file")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=run)


def pick_layers(spec: str, layers: int) -> list[int]:
    if spec == "all":
        return list(range(layers))
    if spec == "last":
        return [layers - 1]
    try:
        i = int(spec)
    except ValueError:
        raise AlignmentError(f"--layer {spec!r}: expected an integer, 'last' or 'all'") from None
    if not -layers <= i < layers:
        raise AlignmentError(f"--layer {i}: the model has {layers} decoder layers (0..{layers - 1})")
    return [i % layers]


def run(args) -> int:
    from agents.plots import alignment_plot
    from models.checkpoint import load_checkpoint, pick_device
    from models.shipped import resolve_checkpoint
    from models.step import StreamingDecoder

    model, tok, _ = load_checkpoint(resolve_checkpoint(args.checkpoint), pick_device(args.device))
    decoder = StreamingDecoder(model, tok)
    data = alignment_data(decoder, args.sentence, k=args.k, delta=args.delta)
    if not data["target_pieces"]:
        raise AlignmentError("the model wrote nothing for this sentence: no attention to plot")
    chosen = pick_layers(str(args.layer), len(data["attention"]))
    panels = [{"name": f"decoder layer {i}", "matrix": data["attention"][i], "p": data["p"][i]}
              for i in chosen]
    title = f"{data['policy']}: {data['sentence']}  →  {data['translation']}"
    out = alignment_plot(args.output, panels, data["source_pieces"], data["target_pieces"],
                         data["token_delays"], title=title if len(title) < 140 else title[:137] + "...")
    if args.json:
        Path(args.json).write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {out}")
    return 0
