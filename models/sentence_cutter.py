"""Where a sentence of a stream ends, decided one arriving word at a time. The server's `auto_segment`
(server/app.py) and the long-form evaluation's segmenters (agents/talks.py) both cut with `cut_words`, so the
evaluation cuts where a live server cuts and knows each end when the server would.

With a `CutRule` of the server's auto_segment, a sentence ends
- after a word ending in . ! ? … (`ends_sentence`), or after its `max_words`-th word: known at once (wait 0);
- before an arriving word where the sentence-boundary classifier finds the open sentence ended: known when
  that word arrives (wait 1);
- before an arriving word whose subwords would overflow the model's positions (wait 1: known a word late, the
  word before might have been the last), or at once after a word that fills them exactly (wait 0).
After every end the next word opens a new sentence: the classifier's context and both limits start again there.
Unpunctuated text (speech recognition, a chat without full stops) would otherwise outgrow the model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from models.sentence_boundary import BoundaryModel, ends_sentence

# why a sentence ended
PUNCT, BOUNDARY, WORDS, POSITIONS, END = "punct", "boundary", "words", "positions", "end"
LIMITS = (WORDS, POSITIONS)   # the ends the server warns of (`sentence_cut`): no end was in sight


@dataclass(frozen=True)
class CutRule:
    punctuation: bool = True                 # end after . ! ? …
    boundary: BoundaryModel | None = None    # end where this classifier says, judged as the next word arrives
    max_words: int | None = None             # end at a sentence's N-th word
    max_subwords: int | None = None          # end where the subwords would overflow this (the model's positions
    #                                          less the source EOS)


NO_CUTS = CutRule(punctuation=False)   # only the client ends its sentences (a stream without auto_segment)


@dataclass(frozen=True)
class OpenSentence:
    """The words of the sentence a stream has open (the classifier reads them) and their subwords' count."""
    words: tuple[str, ...] = ()
    subwords: int = 0


@dataclass
class Segment:
    words: list[str] = field(default_factory=list)
    subwords: list[list[int]] = field(default_factory=list)   # each word's
    ends: bool = False        # the sentence ends after these words (no words: it ends the sentence open before)
    why: str | None = None    # PUNCT, BOUNDARY, WORDS, POSITIONS or END (the caller's `end`)
    wait: int = 0             # words heard after the segment's last one before its end was known


def cut_words(rule: CutRule, before: OpenSentence, words: list[str], subwords: list[list[int]],
              end: bool = False) -> tuple[list[Segment], OpenSentence]:
    """`words` (with each one's `subwords`) arriving behind the open sentence `before`, cut by `rule`; `end`: the
    open sentence ends after them (a client's end_sentence). Returns the segments in order (the last one open
    unless it ends) and the sentence left open. Changes nothing: a caller that refuses the words keeps `before`."""
    out, cur = [], Segment()
    tail, n_sub = list(before.words), before.subwords

    def close(why: str, wait: int) -> None:
        nonlocal cur, tail, n_sub
        cur.ends, cur.why, cur.wait = True, why, wait
        out.append(cur)
        cur, tail, n_sub = Segment(), [], 0

    for w, pieces in zip(words, subwords, strict=True):
        if tail:
            if rule.boundary is not None and rule.boundary.ends_before(tail, w):
                close(BOUNDARY, 1)
            elif rule.max_subwords is not None and n_sub + len(pieces) > rule.max_subwords:
                close(POSITIONS, 1)
        cur.words.append(w)
        cur.subwords.append(pieces)
        tail.append(w)
        n_sub += len(pieces)
        if rule.punctuation and ends_sentence(w):
            close(PUNCT, 0)
        elif rule.max_words is not None and len(tail) >= rule.max_words:
            close(WORDS, 0)
        elif rule.max_subwords is not None and n_sub == rule.max_subwords:
            close(POSITIONS, 0)   # full: no next word can join it
    if end and tail:
        close(END, 0)
    elif cur.words:
        out.append(cur)
    return out, OpenSentence(tuple(tail), n_sub)


def cut_stream(words: list[str], model: BoundaryModel | None = None, max_words: int | None = None,
               encode=None, max_subwords: int | None = None, punctuation: bool = True) -> list[tuple[int, int]]:
    """Cut a word stream as a live server with auto_segment would, the words arriving one by one: [(segment
    length, words heard after it before its end was known)]. `model`: the sentence-boundary classifier (None:
    none); `encode(word) -> subwords` with `max_subwords`: the positions' limit too. The stream's last segment
    ends with the stream (wait 0)."""
    rule = CutRule(punctuation, model, max_words, max_subwords if encode is not None else None)
    cuts, state = [], OpenSentence()
    for w in words:
        length = len(state.words)   # (an end decided before `w` closes these, from earlier words)
        segments, state = cut_words(rule, state, [w], [encode(w) if encode is not None else []])
        for s in segments:
            length += len(s.words)
            if s.ends:
                cuts.append((length, s.wait))
                length = 0
    if state.words:
        cuts.append((len(state.words), 0))
    return cuts


def fit_cuts(cuts: list[tuple[int, int]], words: list[str], encode, max_subwords: int) -> list[tuple[int, int]]:
    """Segments cut by another rule ([(length, wait)] over `words`: every N words, the reference's sentences) cut
    again where one would overflow the model's positions, as auto_segment cuts there; the last piece of each keeps
    its wait."""
    rule, out, start = CutRule(punctuation=False, max_subwords=max_subwords), [], 0
    for n, wait in cuts:
        part = words[start:start + n]
        segments, _ = cut_words(rule, OpenSentence(), part, [encode(w) for w in part], end=True)
        pieces = [(len(s.words), s.wait) for s in segments]
        out.extend(pieces[:-1] + [(pieces[-1][0], wait)] if pieces else [])
        start += n
    return out
