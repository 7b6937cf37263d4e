"""The websocket protocol of `/v1/stream`: message schemas, stable error codes, text handling.

One websocket carries one stream. Every frame is a JSON text object with a
`type`. The client sends `start` first, then source (`words` or `text`),
sentence boundaries (`end_sentence`, or automatic segmentation) and finally
`end_stream`; the server answers `ready`, then a `word` per target word as the
policy writes it, a `sentence` when a sentence's translation is complete, and
`end` once everything sent before `end_stream` is translated. Problems come
back as `error` (with a stable `code`) or `warning` messages.

The pydantic models below are the schema (served at `GET /v1/protocol`); the
hot path builds the same dicts by hand.
"""
from __future__ import annotations

import json
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, TypeAdapter, \
    ValidationError


MessageId = Union[StrictStr, StrictInt, None]
MAX_ID_CHARS = 128          # an `id` is echoed in replies: it must not make them large
MAX_ID_INT = 2 ** 53        # integers a JavaScript client can read back exactly
MAX_WORD_CHARS = 200        # a longer "word" is refused (bad_message)
MAX_PAUSE_S = 3600.0        # start's end_after_pause_s: at most an hour (idle_timeout_s closes a silent stream anyway)


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- client -> server
class Start(_Msg):
    """Open the stream: which model, its latency setting, options."""
    type: Literal["start"]
    model: StrictStr | None = Field(None, description="model name from GET /v1/models (default: the first)")
    k: StrictInt | None = Field(None, description="wait-k lag (wait-k models only)")
    delta: StrictFloat | StrictInt | None = Field(None, description="GMA relaxation offset δ (GMA models only)")
    auto_segment: StrictBool = Field(False, description="end a sentence after each word ending in . ! ? …")
    segmenter: Literal["punct", "boundary"] = Field(
        "punct", description="with auto_segment: 'punct' ends a sentence only after . ! ? …; 'boundary' also where "
                             "the sentence-boundary classifier finds an end (titles, list items, verses ending in "
                             "; or :), judged when the next word arrives")
    end_after_pause_s: StrictFloat | StrictInt | None = Field(
        None, gt=0, le=MAX_PAUSE_S,
        description="end the open sentence when no message has come for this many seconds (a speaker's pause): "
                    "its last words are translated then, not when the next sentence's words end it")
    share: StrictBool | StrictStr | None = Field(
        None, description="true: show this stream's captions to viewers (`ready` gives the watch link and a "
                          "share key); the share key of a feed whose stream went away without `end`: carry it on")
    id: MessageId = None


class Words(_Msg):
    """Complete source words (an element containing spaces is split into several)."""
    type: Literal["words"]
    words: list[StrictStr]
    id: MessageId = None


class Text(_Msg):
    """A raw text chunk; a word cut at the end of the chunk waits for the next space."""
    type: Literal["text"]
    text: StrictStr
    id: MessageId = None


class EndSentence(_Msg):
    """The current sentence's source is complete (ignored if it has no words)."""
    type: Literal["end_sentence"]
    id: MessageId = None


class EndStream(_Msg):
    """No more input: translate what was sent, answer `end`, close."""
    type: Literal["end_stream"]
    id: MessageId = None


class ShareCaptions(_Msg):
    """Start or stop showing this stream's captions to viewers, mid-stream (answered with `shared`)."""
    type: Literal["share"]
    on: StrictBool = Field(description="true: a new feed for viewers, unless one is on already; false: the "
                                       "feed ends (its viewers are told) and the next `true` opens a new one")
    id: MessageId = None


ClientMessage = Annotated[Union[Start, Words, Text, EndSentence, EndStream, ShareCaptions], Field(discriminator="type")]
CLIENT_TYPES = ("start", "words", "text", "end_sentence", "end_stream", "share")
_client_adapter = TypeAdapter(ClientMessage)


# ---------------------------------------------------------------- server -> client
class Limits(_Msg):
    max_words_per_sentence: int
    max_backlog_words: int
    max_message_bytes: int
    rate_limit: float
    idle_timeout_s: float


class Share(BaseModel):
    watch: str = Field(description="the viewers' token: GET /watch/TOKEN/ is their caption page")
    url: str = Field(description="the caption page's path on this server, /watch/TOKEN/")
    key: str = Field(description="for the speaker only: `start` with `share` set to it carries the feed on")


class Ready(_Msg):
    """The stream is open (answer to `start`)."""
    type: Literal["ready"]
    stream: str
    model: str
    policy: Literal["offline", "waitk", "gma"]
    k: int | None
    delta: float | None
    src_lang: str
    tgt_lang: str
    auto_segment: bool
    segmenter: Literal["punct", "boundary"] | None = Field(None, description="how auto_segment finds sentence ends")
    end_after_pause_s: float | None = Field(None, description="the pause that ends the open sentence (start's)")
    share: Share | None = Field(None, description="start's `share`: where viewers watch, and the key to carry on")
    limits: Limits
    server: str | None = Field(None, description="the replica serving this stream (behind Ray Serve)")


class Word(_Msg):
    """A target word, emitted as soon as the policy has written it (never revised)."""
    type: Literal["word"]
    seq: int = Field(description="0, 1, 2... over the whole connection: a gap means a lost message")
    sentence: int = Field(description="sentence index (0-based) within this stream")
    index: int = Field(description="word index within the sentence")
    text: str
    delay: int = Field(description="source words of this sentence read when the word was written")
    source_complete: bool = Field(description="the whole source sentence, its end included, had been read")
    lag_ms: float = Field(description="server time from the arrival of the input this word needed to its emission")


class Sentence(_Msg):
    """A sentence's translation is complete."""
    type: Literal["sentence"]
    sentence: int
    source: str
    translation: str
    delays: list[int]
    source_words: int = Field(description="source words the policy read")
    unread_words: int = Field(description="words of this sentence sent after the model had already ended its "
                                          "translation (written EOS early); they are not translated")
    latency: dict[str, float] | None = Field(description="AL, LAAL, AP, DAL, CW (SimulEval convention, "
                                                         "hypothesis length); null if nothing was written")
    compute_ms: float = Field(description="model compute attributed to this sentence (its share of batched steps)")
    elapsed_ms: float = Field(description="from the arrival of the sentence's first word to its completion")


class End(_Msg):
    """Acknowledges `end_stream`: everything was translated; the server closes the socket (1000)."""
    type: Literal["end"]
    sentences: int
    words: int


class Shared(_Msg):
    """Answers `share`: where viewers watch now, or null (not shared)."""
    type: Literal["shared"]
    share: Share | None
    id: MessageId = Field(None, description="the `share` message's id, if it had one")


class Error(_Msg):
    type: Literal["error"]
    code: str
    message: str
    fatal: bool = Field(description="the server closes the connection after a fatal error")
    id: MessageId = Field(None, description="the `id` of the client message that caused it, if it had one")
    rejected_words: int | None = Field(None, description="source words not accepted (message rejected whole)")
    retry_after: float | None = Field(None, description="`server_busy`: seconds after which to try again")


class Warning(_Msg):  # noqa: A001 - the protocol's name
    type: Literal["warning"]
    code: str
    message: str
    backlog: int | None = None


ServerMessage = Annotated[Union[Ready, Word, Sentence, End, Shared, Error, Warning], Field(discriminator="type")]
server_adapter = TypeAdapter(ServerMessage)

# ---------------------------------------------------------------- error codes
# code -> (fatal, websocket close code or None, meaning). Codes are stable: clients may switch on them.
ERRORS: dict[str, tuple[bool, int | None, str]] = {
    "bad_json": (False, None, "the text frame is not valid JSON"),
    "bad_message": (False, None, "a JSON object, but not a valid message (missing/unknown field, wrong type)"),
    "unknown_type": (False, None, "`type` is missing or not one of " + ", ".join(CLIENT_TYPES)),
    "binary_frame": (False, None, "binary frames are not part of the protocol; send JSON text frames"),
    "message_too_large": (False, None, "the frame exceeds max_message_bytes (frames over 4x the limit "
                                       "are refused by the websocket layer with close code 1009)"),
    "not_started": (False, None, "a source or end message before `start`"),
    "already_started": (False, None, "a second `start` on the same connection"),
    "unknown_model": (False, None, "`start` names a model the server does not serve"),
    "bad_setting": (False, None, "k/delta invalid, out of the allowed range, or the wrong knob for the model"),
    "sentence_too_long": (False, None, "the sentence would exceed max_words_per_sentence or the model's "
                                       "positions; the message was rejected whole, the sentence stays open"),
    "backlog_full": (False, None, "more source words are waiting than max_backlog_words: the message was "
                                  "rejected whole (resend it later)"),
    "stream_ended": (False, None, "a message after `end_stream`"),
    "rate_limited": (True, 1008, "more messages (or pings) per second than the per-connection rate limit"),
    "idle_timeout": (True, 1001, "no valid message from the client for idle_timeout_s seconds"),
    "start_timeout": (True, 1008, "no `start` within start_timeout_s seconds of connecting"),
    "unauthorized": (True, 1008, "missing or wrong API key (Authorization: Bearer KEY, the subprotocol "
                                 "simulserve.key.BASE64URL(KEY), or ?token=KEY)"),
    "too_many_connections": (True, 1013, "this client address has max_connections_per_ip connections open"),
    "too_many_auth_failures": (True, 1008, "this client address failed the API key check too often; wait "
                                           "auth_failure_window_s"),
    "origin_not_allowed": (True, 1008, "the Origin header is not in allowed_origins"),
    "server_full": (True, 1013, "max_streams streams are open; try again later"),
    "server_busy": (True, 1013, "answer to `start`: the model is at the most streams it can keep within the "
                                "delay budget; nothing was accepted, try again after `retry_after` seconds"),
    "not_ready": (True, 1013, "the models are still loading; try again shortly"),
    "slow_consumer": (True, 1008, "the client does not read the server's messages (replies, errors included, "
                                  "pile up)"),
    "internal_error": (True, 1011, "a server fault; only this stream is affected"),
}
WARNINGS = {"slow_down": "over half of max_backlog_words source words are waiting to be read",
            "sentence_cut": "auto_segment: no sentence end within max_words_per_sentence words or the model's "
                            "positions, so the server ended the sentence there"}


def error(code: str, message: str | None = None, msg_id=None, **extra) -> dict:
    fatal = ERRORS[code][0]
    out = {"type": "error", "code": code, "message": message or ERRORS[code][2], "fatal": fatal}
    if msg_id is not None:
        out["id"] = msg_id
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


class ProtocolError(Exception):
    """A client message is refused; becomes an `error` message (see ERRORS)."""

    def __init__(self, code: str, message: str | None = None, msg_id=None, **extra):
        super().__init__(message or ERRORS[code][2])
        self.code, self.message, self.msg_id, self.extra = code, message, msg_id, extra

    def to_message(self) -> dict:
        return error(self.code, self.message, self.msg_id, **self.extra)


def parse_client_message(text: str):
    """One text frame -> a client message model, or ProtocolError(bad_json|unknown_type|bad_message)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # incl. JSONDecodeError and over-long integers
        raise ProtocolError("bad_json", f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ProtocolError("bad_message", f"a message is a JSON object, got {type(data).__name__}")
    msg_id = _echoable_id(data.get("id"))
    bad = _first_bad_string(data)
    if bad is not None:  # JSON allows lone surrogates ("\ud800"); UTF-8, tokenizers and our replies do not
        raise ProtocolError("bad_message", f"{bad}: invalid Unicode (a lone surrogate)", msg_id)
    if data.get("type") not in CLIENT_TYPES:
        raise ProtocolError("unknown_type", f"unknown message type {_brief(data.get('type'))}; expected one of "
                            + ", ".join(CLIENT_TYPES), msg_id)
    try:
        msg = _client_adapter.validate_python(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'][1:]) or 'message'}: {err['msg']}"
                             for err in e.errors()[:3])
        if len(problems) > 300:   # field names come from the client: keep the reply small
            problems = problems[:297] + "..."
        raise ProtocolError("bad_message", f"invalid {data['type']!r} message: {problems}", msg_id) from None
    if isinstance(msg.id, str) and len(msg.id) > MAX_ID_CHARS or isinstance(msg.id, int) and abs(msg.id) > MAX_ID_INT:
        raise ProtocolError("bad_message", f"`id` is limited to {MAX_ID_CHARS} characters or an integer of at "
                            "most 2^53 (it is echoed in replies)")
    return msg


def _brief(x) -> str:
    """A client value quoted in a reply, cut short: a reply must not be as large as the message."""
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


def _echoable_id(x):
    """The message id to echo in an error reply: only a short valid string or a JSON-safe integer."""
    if isinstance(x, bool) or not isinstance(x, (str, int)):
        return None
    if isinstance(x, int):
        return x if abs(x) <= MAX_ID_INT else None
    if len(x) > MAX_ID_CHARS or _has_surrogate(x):
        return None
    return x


def _has_surrogate(x: str) -> bool:
    try:
        x.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _first_bad_string(data):
    """Where the first string with a lone surrogate is (a key or a value, at any depth), or None.
    Iterative: a message nested a few hundred levels deep is valid JSON."""
    stack = [("message", data)]
    while stack:
        where, x = stack.pop()
        if isinstance(x, str):
            if _has_surrogate(x):
                return where
        elif isinstance(x, dict):
            for k, v in x.items():
                if _has_surrogate(k):
                    return f"{where}: a key"
                stack.append((k if where == "message" else f"{where}.{k}", v))
        elif isinstance(x, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(x))
    return None


# ---------------------------------------------------------------- source text handling


def split_words(words: list[str]) -> list[str]:
    return [w for x in words for w in x.split()]


def split_text(partial: str, chunk: str) -> tuple[list[str], str]:
    """(complete words, new partial word) after `chunk` arrives behind `partial`."""
    buf = partial + chunk
    words = buf.split()
    if words and not buf[-1].isspace():
        return words[:-1], words[-1]
    return words, ""


def schemas() -> dict:
    """JSON schemas of every message, and the error codes (GET /v1/protocol)."""
    return {
        "client": {m.__name__: m.model_json_schema() for m in (Start, Words, Text, EndSentence, EndStream,
                                                               ShareCaptions)},
        "server": {m.__name__: m.model_json_schema() for m in (Ready, Word, Sentence, End, Shared, Error, Warning)},
        "errors": {c: {"fatal": f, "close_code": cc, "meaning": m} for c, (f, cc, m) in ERRORS.items()},
        "warnings": WARNINGS,
    }
