"""Decoding options of the one decoding loop: which token a WRITE may be, chosen once per decoder.

Three rules, each a small filter class (`NoRepeatNgram`, `NoStutter`, `NoEarlyEos`, made once per decoder
by `token_filters`) applied in one place, `StreamingDecoder._choose` (so identically for the server,
`translate`, `evaluate`, the SimulEval agents and the benchmarks):
- `no_repeat_ngram = n` (0: off): a WRITE never completes a target n-gram (of subwords) that the
  sentence's translation already contains; small models repeat phrases ("at eight o'clock at eight
  o'clock"), and this removes the exact repeats.
- `no_stutter = n` (0: off): a WRITE never makes the translation end with the same run of m <= n
  subwords twice in a row ("a drink drink", "very very very", "full power full power"), where the run
  does not start inside a word and the source read so far does not repeat itself (`StutterContext`). The models'
  most visible error; unlike `no_repeat_ngram` it leaves a phrase that comes back later alone.
  None (the default) is off for every policy (measured: docs/results.md, "Decoding options").
- `early_eos`: what a simultaneous model's EOS means while the source has not ended. "read" (the
  reference agents' rule): a READ, and the model tries again after the next source word. "write": EOS
  is not allowed until the source has ended, so the step writes the best other token.
Greedy steps only: beam search (offline models) keeps its own scores and ignores both.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from models.errors import UserError

EARLY_EOS = ("read", "write")


class DecodingError(UserError):
    pass


@dataclass(frozen=True)
class DecodingOptions:
    no_repeat_ngram: int = 0
    early_eos: str = "read"
    no_stutter: int | None = None

    def __post_init__(self):
        if isinstance(self.no_repeat_ngram, bool) or not isinstance(self.no_repeat_ngram, int) \
                or not 0 <= self.no_repeat_ngram <= 16:
            raise DecodingError(f"no_repeat_ngram must be an integer from 0 (off) to 16, got {self.no_repeat_ngram!r}")
        if self.no_stutter is not None and (isinstance(self.no_stutter, bool) or not isinstance(self.no_stutter, int)
                                            or not 0 <= self.no_stutter <= 16):
            raise DecodingError(f"no_stutter must be an integer from 0 (off) to 16, got {self.no_stutter!r}")
        if self.early_eos not in EARLY_EOS:
            raise DecodingError(f"early_eos must be one of {', '.join(EARLY_EOS)}, got {self.early_eos!r}")

    def for_policy(self, policy: str) -> DecodingOptions:
        """These options as a decoder of `policy` applies them: no_stutter = None is 0 (off). Off for every
        policy: with the shipped weights the rule lowers BLEU on some test set for each of them (docs/results.md,
        "Decoding options"; the per-policy default table, empty since, was removed: CHANGELOG.md)."""
        if self.no_stutter is not None:
            return self
        return replace(self, no_stutter=0)


def banned_tokens(target: list[int], n: int) -> list[int]:
    """The tokens that would complete an n-gram `target` already contains (its last n-1 tokens
    followed by them occur earlier)."""
    if n <= 0 or len(target) < n - 1:
        return []
    if n == 1:
        return sorted(set(target))
    prefix = target[len(target) - n + 1:]
    return sorted({target[i + n - 1] for i in range(len(target) - n + 1) if target[i:i + n - 1] == prefix})


def stutter_tokens(target: list[int], n: int, context: StutterContext | None = None) -> list[int]:
    """The tokens that would make `target` end with a run of m <= n tokens written twice in a row:
    for each m, the token m places back, if the m-1 tokens before it match the last m-1. With a
    `context` (what the step passes), only runs that `context.counts`."""
    end = len(target)
    return sorted({target[end - m] for m in range(1, n + 1)
                   if end >= 2 * m - 1 and target[end - m + 1:] == target[end - 2 * m + 1:end - m]
                   and (context is None or context.counts(target[end - 2 * m + 1:end - m + 1]))})


@dataclass(frozen=True)
class StutterContext:
    """What the no-stutter rule sees besides the target. A repeated run counts as a stutter only if it
    does not start inside a word (it starts with a word's first piece or with punctuation: pieces
    repeated inside a word, "Kanon|en|en", are a spelling slip, and banning the piece made other
    misspellings) and the source read so far does not repeat itself: neither the run's own text twice
    ("M-I-L-L-E-R" copied from the source) nor any word twice in a row ("Warum, warum" -> "Why, why").
    Each exception removed a measured false ban (docs/results.md). The source is looked at only when a
    run repeats (rare), so a step without one pays nothing for it."""
    tok: object               # the Tokenizer: word_start, no_word_chars, piece_text per piece id
    source_tokens: list[int]  # the source read so far
    source_words: list[str]

    @cached_property
    def source(self) -> str:
        """The source read so far, squeezed (models/tokenizer.py)."""
        return "".join(self.tok.piece_text[t] for t in self.source_tokens) + " "

    @cached_property
    def source_repeats(self) -> bool:
        """The source read so far has a word twice in a row (letters and digits, case ignored)."""
        words = ["".join(ch for ch in w.lower() if ch.isalnum()) for w in self.source_words]
        return any(a and a == b for a, b in zip(words, words[1:]))

    def counts(self, run: list[int]) -> bool:
        tok = self.tok
        if not (tok.word_start[run[0]] or tok.no_word_chars[run[0]]) or self.source_repeats:
            return False
        text = "".join(tok.piece_text[t] for t in run)
        return not (text.strip() and text * 2 in self.source)


class TokenFilter:
    """A decoding rule where the step picks a WRITE's token: `bans` names the tokens one row may not
    write (host, from its target so far), `mask` edits every row's logits at once (device)."""
    uses_context = False   # its bans read the source (StutterContext)

    def bans(self, target: list[int], context: StutterContext | None = None) -> list[int]:
        return []

    def mask(self, logits, finished) -> None:
        """In place on (B, V) logits; finished (B,) bool: the row's source has ended."""


@dataclass(frozen=True)
class NoRepeatNgram(TokenFilter):
    n: int

    def bans(self, target, context=None):
        return banned_tokens(target, self.n)


@dataclass(frozen=True)
class NoStutter(TokenFilter):
    n: int
    uses_context = True

    def bans(self, target, context=None):
        return stutter_tokens(target, self.n, context)


@dataclass(frozen=True)
class NoEarlyEos(TokenFilter):
    """early_eos "write": no EOS before the source has ended (a tensor edit, no host value: sync-free)."""
    eos_id: int

    def mask(self, logits, finished):
        import torch
        eos = self.eos_id
        logits[:, eos] = torch.where(finished, logits[:, eos], torch.full_like(logits[:, eos], float("-inf")))


def banning_filters(options: DecodingOptions) -> list[TokenFilter]:
    """The filters of `options` that ban tokens per row (planned on the host)."""
    filters: list[TokenFilter] = []
    if options.no_repeat_ngram:
        filters.append(NoRepeatNgram(options.no_repeat_ngram))
    if options.no_stutter:
        filters.append(NoStutter(options.no_stutter))
    return filters


def token_filters(options: DecodingOptions, eos_id: int) -> list[TokenFilter]:
    """Every filter `options` turn on (for a decoder whose policy defaults are already filled in)."""
    return banning_filters(options) + ([NoEarlyEos(eos_id)] if options.early_eos == "write" else [])


def filter_bans(filters: list[TokenFilter], target: list[int], context: StutterContext | None = None) -> list[int]:
    """Every token `filters` forbid a WRITE to choose after `target`."""
    bans: set[int] = set()
    for f in filters:
        bans.update(f.bans(target, context))
    return sorted(bans)


def all_bans(target: list[int], options: DecodingOptions, context: StutterContext | None = None) -> list[int]:
    """Every token the options forbid a WRITE to choose after `target`."""
    return filter_bans(banning_filters(options), target, context)


def add_decoding_arguments(parser) -> None:
    """--no-repeat-ngram, --no-stutter and --early-eos of every command that translates."""
    parser.add_argument("--no-repeat-ngram", type=int, default=0, metavar="N",
                        help="never write a subword that repeats an N-gram of the sentence's translation "
                             "(default 0: off)")
    parser.add_argument("--no-stutter", type=int, default=None, metavar="N",
                        help="never write a subword that repeats the last M <= N subwords right after them "
                             "(default 0: off)")
    parser.add_argument("--early-eos", choices=EARLY_EOS, default="read",
                        help="an EOS before the source has ended: read (default: wait for the next word) or "
                             "write (the best other token)")


def decoding_options(args) -> DecodingOptions:
    return DecodingOptions(no_repeat_ngram=getattr(args, "no_repeat_ngram", 0) or 0,
                           early_eos=getattr(args, "early_eos", None) or "read",
                           no_stutter=getattr(args, "no_stutter", None))
