"""Streams whose words arrive out of phase, as a server's do: the `--arrivals staggered` of `bench step`.

`simulate` (models/translate.py) pushes every waiting stream's next word, then steps until all of them wait
again: the streams move in lockstep, and only the first step of each round has new words to encode. In a
server the speakers are out of phase, so nearly every step encodes some stream's words while the others write.
`staggered` drives the same step that way: `streams` streams at once, each getting its next word every `gap`
steps (stream j first at step j mod gap), each starting the next sentence as soon as its previous one is done,
and every step one batched `StreamingDecoder.step` of the streams that can move (as the server's job). The
translations are those of `simulate`: a stream's output does not depend on when its words arrive (tests).
"""
from __future__ import annotations

import time
from collections import deque

import torch

from models.step import StreamingDecoder
from models.translate import SentenceResult


class _Stream:
    __slots__ = ("index", "sentence", "words", "pos", "state", "next", "compute")

    def __init__(self, index: int, sentence: str, state, first: int):
        self.index, self.sentence, self.words, self.pos, self.state = index, sentence, sentence.split(), 0, state
        self.next, self.compute = first, 0.0


@torch.inference_mode()   # (as simulate: once for the loop)
def staggered(decoder: StreamingDecoder, sentences: list[str], streams: int, gap: int = 4) -> list[SentenceResult]:
    """Translate `sentences` over `streams` concurrent streams with out-of-phase arrivals (module docstring);
    SentenceResult per sentence, in the order given."""
    if streams < 1 or gap < 1:
        raise ValueError("streams and gap must be at least 1")
    todo = deque(enumerate(sentences))
    results: list[SentenceResult | None] = [None] * len(sentences)
    live: list[_Stream | None] = [None] * streams
    step = 0

    def begin(j: int, first: int) -> None:
        live[j] = None
        if todo:
            i, sentence = todo.popleft()
            live[j] = _Stream(i, sentence, decoder.new_stream(), first)

    for j in range(streams):
        begin(j, j % gap)
    try:
        while any(live):
            for a in live:   # arrivals due at this step: the next word, or the end of the sentence
                if a is not None and step >= a.next and not a.state.end_received:
                    if a.pos < len(a.words):
                        decoder.push(a.state, a.words[a.pos])
                        a.pos += 1
                    else:
                        decoder.finish(a.state)
                    a.next = step + gap
            moving = [a for a in live if a is not None and not (a.state.done or a.state.blocked)]
            if moving:
                t0 = time.perf_counter()
                decoder.step([a.state for a in moving])
                share = (time.perf_counter() - t0) / len(moving)
                for a in moving:
                    a.compute += share
            step += 1
            for j, a in enumerate(live):
                if a is not None and a.state.done:
                    results[a.index] = SentenceResult.of(a.sentence, a.state, a.compute)
                    decoder.close(a.state)
                    begin(j, step)   # the next sentence's first word comes with the next step
    finally:
        for a in live:
            if a is not None:
                decoder.close(a.state)
    return results
