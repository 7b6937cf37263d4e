"""Talks for long-form evaluation, and the segmenters that cut a talk's word stream into sentences.

A talk is a whole document of a test set in its original order -- a Bible
chapter, a help page, a game's dialogue file -- with its sentence-level
references kept. `prepare-data` writes, next to every valid/test file, a
SPLIT[.NAME].docs file naming the document of each line (the per-source
readers keep the package's order, and the split moves whole groups), so a talk
is the lines of one document name, in file order.

A segmenter sees only what a live server sees -- the source words as they
arrive -- and says where a sentence ends. Each returns the lengths of the
segments it cuts, which cover the talk's words in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from models.errors import UserError


class TalkError(UserError):
    """Bad long-form input: no document file, too few talks, a bad segmenter."""


@dataclass
class Talk:
    name: str                 # SET/DOCUMENT, unique
    set: str
    sources: list[str]        # the talk's source sentences, in order
    references: list[str]     # their references, line by line

    @property
    def words(self) -> list[str]:
        return [w for s in self.sources for w in s.split()]

    @property
    def sentence_lengths(self) -> list[int]:
        return [len(s.split()) for s in self.sources]


def group_talks(set_name: str, sources: list[str], references: list[str], docs: list[str],
                min_words: int = 100) -> list[Talk]:
    """The lines of one document form a talk, in file order; talks under `min_words` source words are dropped."""
    if not (len(sources) == len(references) == len(docs)):
        raise TalkError(f"{set_name}: {len(sources)} source, {len(references)} reference and "
                        f"{len(docs)} document lines; they must be aligned line by line")
    talks: dict[str, Talk] = {}
    for src, ref, doc in zip(sources, references, docs):
        # a document whose lines are interleaved with another's (a game's catalogue sorted by key)
        # is still one talk, its lines in their order
        talk = talks.setdefault(doc, Talk(f"{set_name}/{doc}", set_name, [], []))
        talk.sources.append(src)
        talk.references.append(ref)
    talks = list(talks.values())
    return [t for t in talks if len(t.words) >= min_words]


def docs_path(source_path: Path, src_lang: str) -> Path:
    """test.bible.de -> test.bible.docs"""
    name = source_path.name
    if not name.endswith("." + src_lang):
        raise TalkError(f"{source_path}: long-form evaluation needs prepare-data's SPLIT[.NAME].{src_lang} files")
    return source_path.with_name(name[: -len(src_lang)] + "docs")


def read_docs(path: Path) -> list[str]:
    if not path.is_file():
        raise TalkError(f"{path} not found: long-form evaluation needs the document of every line, which "
                        "`simulserve prepare-data` writes (SPLIT[.NAME].docs); prepare the data again")
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


# ------------------------------------------------------------------ segmenters
# A segmenter is f(talk, encode=None, max_subwords=None) -> [(segment length, wait)]: `wait` is how many words
# after the segment's last one had to be heard before its end was known (0 for punctuation and a maximum length,
# 1 for the boundary classifier, which judges a gap when the next word arrives). Given `encode(word) ->
# subwords`, every segmenter also ends a segment where it would overflow `max_subwords` (the model's positions
# less the EOS), as the server's auto_segment does (models/sentence_cutter.py: a word late, or at once where a
# word fills them).

# the server's default max_words_per_sentence (server/settings.py; a test holds the two equal): its auto_segment
# ends a sentence at that many words too, so the server's segmenters here do as well
MAX_WORDS = 200


def _server_cap(max_words: int | None) -> int:
    return MAX_WORDS if max_words is None else min(max_words, MAX_WORDS)


def _auto_segment(max_words: int | None, model=None):
    """The server's auto_segment: after a word ending in . ! ? …, at a sentence's 200th word (or `max_words`,
    the smaller), and given the sentence-boundary classifier `model` ('boundary') where it finds an end, one
    word on; the model's positions cut in the same pass."""
    from models.sentence_cutter import cut_stream
    return lambda talk, encode=None, max_subwords=None: cut_stream(talk.words, model, _server_cap(max_words),
                                                                   encode, max_subwords)


def _fitted(cuts_of):
    """A segmenter of its own rule (`cuts_of(talk)`), then fitted to the model's positions as auto_segment is."""
    from models.sentence_cutter import fit_cuts

    def segmenter(talk, encode=None, max_subwords=None):
        cuts = cuts_of(talk)
        return cuts if encode is None else fit_cuts(cuts, talk.words, encode, max_subwords)
    return segmenter


def _fixed(words: list[str], size: int) -> list[tuple[int, int]]:
    """A cut every `size` words, whatever they say."""
    n = len(words)
    return [(size, 0)] * (n // size) + ([(n % size, 0)] if n % size else [])


_BOUNDARY_MODELS: dict = {}


def _boundary_model(model_dir):
    from models.sentence_boundary import load_boundary_model
    if model_dir not in _BOUNDARY_MODELS:
        _BOUNDARY_MODELS[model_dir] = load_boundary_model(model_dir)
    return _BOUNDARY_MODELS[model_dir]


def _max_suffix(spec: str, name: str) -> int | None:
    """'NAME' -> None, 'NAME+max:N' -> N (N >= 1); anything else raises ValueError."""
    if spec == name:
        return None
    if spec.startswith(name + "+max:"):
        n = int(spec.split(":", 1)[1])
        if n >= 1:
            return n
    raise ValueError(spec)


def _boundary_segmenter(max_words: int | None, model_dir):
    # (a missing or malformed model fails here, SegmenterError, before any work)
    return _auto_segment(max_words, _boundary_model(model_dir))


def parse_segmenter(spec: str, boundary_model=None):
    """A segmenter by name: 'punct' (auto_segment), 'punct+max:N' (auto_segment or N words, whichever
    first), 'boundary' and 'boundary+max:N' (punctuation or the sentence-boundary classifier, the server's
    auto_segment 'boundary'; `boundary_model` is its directory, default the shipped one), 'fixed:N' (every
    N words) or 'oracle' (the reference sentence ends: the per-sentence set-up streamed as one talk).
    Returns f(talk, encode=None, max_subwords=None) -> [(segment length, wait)] (see above)."""
    spec = spec.strip()
    use_boundary = False
    try:
        if spec.startswith("punct"):
            n = _max_suffix(spec, "punct")
            return _auto_segment(n)
        if spec.startswith("boundary"):
            n = _max_suffix(spec, "boundary")
            use_boundary = True
        if spec.startswith("fixed:"):
            n = int(spec.split(":", 1)[1])
            if n >= 1:
                return _fitted(lambda talk: _fixed(talk.words, n))
        if spec == "oracle":
            return _fitted(lambda talk: [(n, 0) for n in talk.sentence_lengths])
    except ValueError:
        pass
    else:
        if use_boundary:      # outside the try: a bad classifier directory says so, not "unknown segmenter"
            return _boundary_segmenter(n, boundary_model)
    raise TalkError(f"unknown segmenter {spec!r}: use punct, punct+max:N, boundary, boundary+max:N, fixed:N or "
                    "oracle (N >= 1)")
