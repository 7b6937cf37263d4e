"""Decoding options of the one decoding loop: which token a WRITE may be, chosen once per decoder.

Two rules, each applied in `StreamingDecoder._decode` (so identically for the server, `translate`,
`evaluate`, the SimulEval agents and the benchmarks):
- `no_repeat_ngram = n` (0: off): a WRITE never completes a target n-gram (of subwords) that the
  sentence's translation already contains; small models repeat phrases ("at eight o'clock at eight
  o'clock"), and this removes the exact repeats.
- `early_eos`: what a simultaneous model's EOS means while the source has not ended. "read" (the
  reference agents' rule): a READ, and the model tries again after the next source word. "write": EOS
  is not allowed until the source has ended, so the step writes the best other token.
Greedy steps only: beam search (offline models) keeps its own scores and ignores both.
"""
from __future__ import annotations

from dataclasses import dataclass

from models.errors import UserError

EARLY_EOS = ("read", "write")


class DecodingError(UserError):
    pass


@dataclass(frozen=True)
class DecodingOptions:
    no_repeat_ngram: int = 0
    early_eos: str = "read"

    def __post_init__(self):
        if isinstance(self.no_repeat_ngram, bool) or not isinstance(self.no_repeat_ngram, int) \
                or not 0 <= self.no_repeat_ngram <= 16:
            raise DecodingError(f"no_repeat_ngram must be an integer from 0 (off) to 16, got {self.no_repeat_ngram!r}")
        if self.early_eos not in EARLY_EOS:
            raise DecodingError(f"early_eos must be one of {', '.join(EARLY_EOS)}, got {self.early_eos!r}")


def banned_tokens(target: list[int], n: int) -> list[int]:
    """The tokens that would complete an n-gram `target` already contains (its last n-1 tokens
    followed by them occur earlier)."""
    if n <= 0 or len(target) < n - 1:
        return []
    if n == 1:
        return sorted(set(target))
    prefix = target[len(target) - n + 1:]
    return sorted({target[i + n - 1] for i in range(len(target) - n + 1) if target[i:i + n - 1] == prefix})


def add_decoding_arguments(parser) -> None:
    """--no-repeat-ngram and --early-eos of every command that translates."""
    parser.add_argument("--no-repeat-ngram", type=int, default=0, metavar="N",
                        help="never write a subword that repeats an N-gram of the sentence's translation "
                             "(default 0: off)")
    parser.add_argument("--early-eos", choices=EARLY_EOS, default="read",
                        help="an EOS before the source has ended: read (default: wait for the next word) or "
                             "write (the best other token)")


def decoding_options(args) -> DecodingOptions:
    return DecodingOptions(no_repeat_ngram=getattr(args, "no_repeat_ngram", 0) or 0,
                           early_eos=getattr(args, "early_eos", None) or "read")
