"""What a lone speaker's last words wait for: the step's time while the words arrive and after the source ended,
and how many steps a sentence's tail takes, per step form.

    python recipes/tail_steps.py                               # gma_delta1, 64 unseen sentences, batch 1
    python recipes/tail_steps.py --forms default,gemv --batch 8

Each sentence is streamed word by word by `simulate` (its streams in lockstep, `--batch` at a time); every
`StreamingDecoder.step` call is timed and counted as a *word step* (a word of some stream still to come) or a
*tail step* (every stream's source has ended: what is left is written one subword a step). Once a sentence's
source has ended, its last word waits for all of its tail's steps, so on a slow CPU the tail decides the p99 of
`bench server`'s "after the end" delays even with one speaker: a tail of n steps of t ms each adds about n·t.
Forms take turns within each round (the second round is the timed one), so a slow spell falls on every form alike;
`tokens` is a digest of what each form wrote (float32 forms agree; int8 writes its own).
"""
from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.checkpoint import load_checkpoint  # noqa: E402
from models.cpu_info import cpu_summary  # noqa: E402
from models.shipped import resolve_checkpoint  # noqa: E402
from models.benchmarks.host_overhead import TimedDecoder  # noqa: E402
from models.translate import simulate  # noqa: E402


class TailClock(TimedDecoder):
    """TimedDecoder (a clock around every step) that also notes, per step, whether every stream in it had its source
    ended, and counts each stream's steps after its end."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ended: list[bool] = []          # per timed step: all of its streams past their end
        self.after_end: dict[int, int] = {}  # id(stream) -> its steps after its end

    def step(self, states, *args, **kwargs):
        out = super().step(states, *args, **kwargs)
        self.ended.append(all(s.end_received for s in states))
        for s in states:
            if s.end_received:
                self.after_end[id(s)] = self.after_end.get(id(s), 0) + 1
        return out


def stream_group(dec: TailClock, group: list[str], word: list, tail: list, tails: list, tokens: list) -> None:
    """Stream `group` word by word through `simulate` (the project's one streaming loop, its streams in lockstep);
    step times into `word` / `tail`, each stream's steps after its end into `tails`, its tokens into `tokens`."""
    dec.step_seconds, dec.ended, dec.after_end = [], [], {}
    simulate(dec, group, batch_size=len(group), tokens_out=tokens)
    for seconds, ended in zip(dec.step_seconds, dec.ended):
        (tail if ended else word).append(seconds)
    tails.extend(dec.after_end.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="gma_delta1")
    p.add_argument("--source", default="data/de-en-everyday/test.unseen.de")
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--batch", type=int, default=1, help="streams stepped together (lockstep)")
    p.add_argument("--forms", default="default,gemv,int8,plain")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, _ = load_checkpoint(resolve_checkpoint(args.model), torch.device("cpu"), torch.float32)
    forms = args.forms.split(",")
    decs = {f: TailClock(model, tok, form=f) for f in forms}
    with open(args.source, encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()][:args.sentences]
    runs = {f: ([], [], [], []) for f in forms}
    with torch.inference_mode():
        for timed in (False, True):
            for start in range(0, len(sentences), args.batch):
                for f in forms:
                    word, tail, tails, tokens = runs[f] if timed else ([], [], [], [])
                    stream_group(decs[f], sentences[start:start + args.batch], word, tail, tails, tokens)
    print(f"CPU: {cpu_summary()['line']}; torch {torch.__version__}, {args.threads} thread(s)")
    print(f"{args.model}, {len(sentences)} sentences of {args.source} word by word, {args.batch} at a time")
    print("| form | word steps | ms a word step | tail steps | ms a tail step "
          "| tail steps a sentence: mean / p90 / max | tail ms a sentence: mean / p90 / max | tokens |")
    print("|---|---:|---:|---:|---:|---|---|---|")
    for f in forms:
        word, tail, tails, tokens = runs[f]
        mean_tail = statistics.fmean(tail) * 1000
        ms = sorted(n * mean_tail for n in tails)
        q90 = sorted(tails)[int(0.9 * (len(tails) - 1))]
        print(f"| {f} | {len(word)} | {statistics.fmean(word) * 1000:.2f} | {len(tail)} | {mean_tail:.2f} "
              f"| {statistics.fmean(tails):.1f} / {q90} / {max(tails)} "
              f"| {statistics.fmean(ms):.0f} / {ms[int(0.9 * (len(ms) - 1))]:.0f} / {ms[-1]:.0f} "
              f"| {hashlib.sha256(repr(tokens).encode()).hexdigest()[:8]} |")


if __name__ == "__main__":
    main()
