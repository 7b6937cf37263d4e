"""Everything one live stream owns: received source, cache slot, policy values, output.

The model and the cache pool are shared; a StreamState is the only per-stream
object. Its fields are plain Python values, so a server can hold thousands and
drop one at once when its client disconnects. The numbers only the model uses
(k, δ, GMA's running sums, a variant's carried context) live on the device in
the cache pool's slot-indexed state, next to the stream's caches.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from models.errors import UserError
from models.policies import Policy


class StreamError(UserError):
    """Bad use of a stream: words after the end of the source, a too-long sentence..."""


class SourceTooLong(StreamError):
    pass


@dataclass
class TargetWord:
    text: str
    delay: int          # source words read when the word was emitted
    subword_delay: int  # source subwords read (EOS counted once the source ended)


@dataclass(slots=True)
class StepOutput:
    """What one step did for one stream. Read-only for its users: a READ is one shared instance (READ_OUTPUT)."""
    action: str                       # "read" | "write" | "done"
    token: int | None = None
    words: tuple[TargetWord, ...] = ()   # the target words this step completed
    finished: bool = False            # the target sentence is complete


READ = "read"
WRITE = "write"
DONE = "done"
READ_OUTPUT = StepOutput(READ)   # (every READ: nothing of its own to say, and a step has hundreds of them)


@dataclass(slots=True)   # (a server's step reads a dozen fields of every row: slots read faster than a dict)
class StreamState:
    policy: Policy
    slot: int | None = None
    source_words: list[str] = field(default_factory=list)
    source_tokens: list[int] = field(default_factory=list)
    inbox: list[tuple[str, list[int]]] = field(default_factory=list)  # received, not yet read
    # each <unk> piece read (Tokenizer.unknown_runs), and which of them the target copied: what its <unk>s write
    source_unknown: list = field(default_factory=list)
    unknown_used: set[int] = field(default_factory=set)
    end_received: bool = False         # the client ended the sentence (the inbox may still hold words)
    source_finished: bool = False      # the policy has read every word and the end
    n_encoded: int = 0                 # source positions whose caches are filled
    target_tokens: list[int] = field(default_factory=list)
    token_delays: list[int] = field(default_factory=list)   # per target token, source positions read
    pending: list[int] = field(default_factory=list)         # pieces of the word being written
    words: list[TargetWord] = field(default_factory=list)    # released target words
    queue: list[int] = field(default_factory=list)           # tokens decided ahead (beam search)
    need: int = 0                      # source positions the next decoder trial needs (GMA)
    blocked: bool = False              # the last step read; nothing new has arrived since
    dirty: bool = True                 # the device's slot row (models/slot_state.py) is behind the host's values
    # its slot's policy fields still hold an earlier stream's (reset by the first decode)
    fresh: bool = True
    done: bool = False
    in_flight: bool = False            # in a decoder step launched and not yet collected (StreamingDecoder.launch)
    record: list[dict] | None = None   # per written token: p, n, attention (for plots)

    @property
    def available(self) -> int:
        """Source positions the decoder may see: subwords, plus EOS once the source ended."""
        return len(self.source_tokens) + (1 if self.source_finished else 0)

    @property
    def translation(self) -> str:
        return " ".join(w.text for w in self.words)

    @property
    def delays(self) -> list[int]:
        return [w.delay for w in self.words]
