"""Simulated streaming over whole files: `simulserve translate`.

Each sentence becomes a stream; its words are pushed one at a time (or in the
given chunks) and the shared step loop runs until the stream waits. Sentences
are stepped together in batches, which changes nothing in their outputs (each
stream's computation depends only on its own state) and is much faster.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

import torch

from models.step import StreamingDecoder
from models.decoding import add_decoding_arguments, decoding_options
from models.step_form import add_step_argument


@dataclass
class SentenceResult:
    source: str
    prediction: str
    delays: list[int]            # per target word: source words read at emission
    subword_delays: list[int]    # per target word: source subwords read (EOS counted)
    token_delays: list[int]      # per target subword incl. EOS: source subwords read
    source_words: int
    source_subwords: int
    target_tokens: int
    compute_ms: float            # model compute attributed to this sentence
    # with simulate(steps=True): one (source words pushed, end sent, compute s, target words out so far)
    # per advance, so a long-form run can put the sentence's steps on a talk's clock
    steps: list[tuple[int, bool, float, int]] | None = None

    @classmethod
    def of(cls, source: str, s, compute_s: float, steps=None) -> "SentenceResult":
        """The result of a finished stream state `s` (models/stream.py) translating `source`."""
        return cls(source=source, prediction=s.translation, delays=s.delays,
                   subword_delays=[w.subword_delay for w in s.words], token_delays=list(s.token_delays),
                   source_words=len(s.source_words), source_subwords=len(s.source_tokens),
                   target_tokens=len(s.target_tokens), compute_ms=round(compute_s * 1000, 3), steps=steps)

    def to_json(self) -> str:
        d = asdict(self)
        if d["steps"] is None:
            del d["steps"]
        return json.dumps(d, ensure_ascii=False)


@torch.inference_mode()   # (once for the whole loop: each step's launch and collect then skip entering it)
def simulate(decoder: StreamingDecoder, sentences: list[str], *, k=None, delta=None, beam: int = 1,
             whole_sentence: bool = False, chunks: list[list[int]] | None = None,
             batch_size: int = 16, record: bool = False, progress=None, tokens_out: list | None = None,
             steps: bool = False):
    """Translate `sentences` with simulated word-by-word arrival.

    whole_sentence: push every word at once, then end the source (offline
    simulation; for a simultaneous policy it gives the same words, all at |x|).
    chunks[i]: sizes of the word groups in which sentence i arrives.
    tokens_out: a list that receives each sentence's target subword ids (EOS included), in order.
    steps: also return each sentence's step timeline (SentenceResult.steps).
    Returns SentenceResult per sentence (and the states when record=True).
    """
    results, states_out = [], []
    for start in range(0, len(sentences), batch_size):
        group = sentences[start:start + batch_size]
        words = [s.split() for s in group]
        plan = []
        for i, w in enumerate(words):
            sizes = [len(w)] if whole_sentence else (chunks[start + i] if chunks else [1] * len(w))
            if sum(sizes) != len(w) or any(c < 0 for c in sizes):
                raise ValueError(f"chunk sizes {sizes} do not cover the {len(w)} words of sentence {start + i}")
            plan.append([c for c in sizes if c > 0])
        states = [decoder.new_stream(k=k, delta=delta, beam=beam, record=record) for _ in group]
        compute = [0.0] * len(group)
        pos = [0] * len(group)
        cursor = [0] * len(group)
        timeline = [[] for _ in group] if steps else None
        try:
            while True:
                live = [i for i, s in enumerate(states) if not s.done]
                if not live:
                    break
                for i in live:  # the next arrival for every stream that waits
                    if cursor[i] < len(plan[i]):
                        n = plan[i][cursor[i]]
                        decoder.push(states[i], words[i][pos[i]:pos[i] + n])
                        pos[i] += n
                        cursor[i] += 1
                    elif not states[i].end_received:
                        decoder.finish(states[i])
                decoder.advance([states[i] for i in live], shares := [0.0] * len(live))
                for i, c in zip(live, shares):
                    compute[i] += c
                    if timeline is not None:
                        timeline[i].append((pos[i], states[i].end_received, c, len(states[i].delays)))
                    if states[i].end_received and not states[i].done:  # nothing more will arrive
                        raise RuntimeError(f"stream {start + i} stalled after the end of its source "
                                           "(a decoder bug; please report it with the sentence)")
            for i, s in enumerate(states):
                results.append(SentenceResult.of(group[i], s, compute[i],
                                                 steps=timeline[i] if timeline is not None else None))
                if tokens_out is not None:
                    tokens_out.append(list(s.target_tokens))
                if progress is not None:
                    progress.update(1)
            if record:
                states_out.extend(states)
        finally:
            for s in states:
                decoder.close(s)
    return (results, states_out) if record else results


def source_length_error(tok, max_positions: int, sentence: str) -> str | None:
    """Why `sentence` cannot be one stream of a model with `max_positions` positions (its subwords and EOS do
    not fit), or None: what `StreamingDecoder.push` would refuse, known before a batch starts."""
    n = sum(len(tok.encode_word(w)) for w in sentence.split()) + 1
    if n > max_positions:
        return f"sentence too long: {n} subwords with EOS, the model takes at most {max_positions}"
    return None


def register(sub) -> None:
    p = sub.add_parser(
        "translate", help="translate sentences with simulated streaming (JSON lines out)",
        description="Translate sentences word by word as a stream would see them; one JSON line per sentence "
                    "(prediction, delays, compute time).",
        epilog="examples:\n"
               "  echo 'Das Haus ist sehr alt .' | simulserve translate       # gma_delta1, word by word\n"
               "  simulserve translate -m waitk --k 5 -i test.de -o out.jsonl\n"
               "  simulserve translate -m offline --beam 5 --offline -i test.de",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", "-m", help="checkpoint directory or shipped model name (default gma_delta1)")
    p.add_argument("--input", "-i", help="source sentences, one per line (default: stdin)")
    p.add_argument("--output", "-o", help="JSON lines output (default: stdout)")
    p.add_argument("--k", type=int, help="wait-k lag (wait-k models)")
    p.add_argument("--delta", type=float, help="GMA relaxation offset δ (GMA models)")
    p.add_argument("--beam", type=int, default=1, help="beam size (offline models)")
    p.add_argument("--offline", action="store_true", help="give each sentence whole instead of word by word")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16 (CUDA)")
    add_step_argument(p)
    add_decoding_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from tqdm import tqdm

    from models.checkpoint import load_checkpoint, pick_device, pick_dtype
    from models.shipped import resolve_checkpoint
    device = pick_device(args.device)
    model, tok, _ = load_checkpoint(resolve_checkpoint(args.checkpoint), device, pick_dtype(args.dtype, device))
    decoder = StreamingDecoder(model, tok, form=args.step, options=decoding_options(args))
    src = open(args.input, encoding="utf-8") if args.input else sys.stdin
    sentences = [line.rstrip("\n") for line in src]
    # a line the model cannot take (too long) gets an error line in its place; the others are translated: one
    # bad line in a long file must not lose the rest, and the output stays line for line with the input
    errors = {i: e for i, line in enumerate(sentences)
              if (e := source_length_error(tok, model.cfg.max_positions, line)) is not None}
    good = [i for i in range(len(sentences)) if i not in errors]
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    written = 0

    def errors_before(end: int) -> None:
        nonlocal written
        for i in range(written, end):
            if i in errors:
                out.write(json.dumps({"source": sentences[i], "line": i + 1, "error": errors[i]},
                                     ensure_ascii=False) + "\n")
        written = max(written, end)

    with tqdm(total=len(good), disable=not args.output, unit="sent") as bar:
        results = simulate(decoder, [sentences[i] for i in good], k=args.k, delta=args.delta, beam=args.beam,
                           whole_sentence=args.offline, batch_size=args.batch_size, progress=bar)
        for i, r in zip(good, results):
            errors_before(i)
            out.write(r.to_json() + "\n")
            written = i + 1
    errors_before(len(sentences))
    out.flush()
    if errors:
        lines = ", ".join(str(i + 1) for i in list(errors)[:10]) + (" ..." if len(errors) > 10 else "")
        print(f"simulserve translate: {len(errors)} of {len(sentences)} lines not translated (line {lines}: "
              f"{next(iter(errors.values()))}); their output lines hold the error", file=sys.stderr)
        return 1
    return 0
