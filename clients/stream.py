"""`simulserve stream`: send a text file (or stdin) to a simulserve server and show live captions.

    simulserve stream talk.txt                          # one sentence per line, 150 words per minute
    simulserve stream talk.txt --wpm 0                  # as fast as the server translates
    cat notes.txt | simulserve stream --auto-segment    # continuous text, sentences cut at . ! ?
    simulserve stream talk.txt --url wss://host/v1/stream --api-key KEY

Exit codes: 0 done, 2 server unreachable or not a simulserve server, 3 server
full, still loading, or busy for longer than --busy-wait, 4 API key or origin
rejected, 5 other server error. A `server_busy` refusal (the model is at its
real-time capacity) is retried after the server's `retry_after`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import ssl
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from clients.asr_input import AsrInputError, Stabilizer, stable_lines, timed_lines
from clients.caption_feed import CaptionFeed, CaptionServer, parse_address
from clients.subtitles import LiveSubtitles

DEFAULT_URL = "ws://127.0.0.1:8000/v1/stream"
EXIT = {"server_full": 3, "not_ready": 3, "server_busy": 3, "unauthorized": 4, "origin_not_allowed": 4}
HINTS = {
    "server_full": "the server is full; try again later",
    "server_busy": "the server stayed at its real-time capacity for longer than --busy-wait",
    "not_ready": "the server is still loading its models; try again shortly",
    "unauthorized": "the server rejected the API key (pass --api-key or set SIMULSERVE_API_KEY)",
    "origin_not_allowed": "the server does not accept this origin",
}


class ClientError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.exit_code = code


@dataclass
class Summary:
    sentences: list[dict] = field(default_factory=list)
    words: list[dict] = field(default_factory=list)
    ready: dict | None = None
    connections: list[dict] = field(default_factory=list)   # every connection's `ready` (reconnects add one)
    warnings: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    # the speaker's clock (time.monotonic): when the first source word was due (one word interval before it
    # was sent); each `word` message also gets `received_s`, seconds on this clock (long-form scoring), or, in
    # a stream not paced (--wpm 0), since the first `ready` (`opened`)
    clock_origin: float | None = None
    opened: float | None = None
    paced: int = 0                      # source words sent at the pace so far
    share: dict | None = None           # `share`: the feed's watch token, page path and key (a reconnect carries it on)


def watch_url(url: str, path: str) -> str:
    """The http(s) address of a shared stream's caption page, on the server of websocket `url`."""
    parts = urlsplit(url)
    return urlunsplit(({"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme), parts.netloc, path, "", ""))


def normalize_url(url: str) -> str:
    if "://" not in url:
        url = "ws://" + url
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ClientError(f"unsupported URL scheme {parts.scheme!r} (use ws:// or wss://)", 2)
    return urlunsplit((scheme, parts.netloc, parts.path if parts.path not in ("", "/") else "/v1/stream",
                       parts.query, ""))


def ssl_context(url: str, cafile: str | None, insecure: bool):
    if not url.startswith("wss://"):
        return None
    ctx = ssl.create_default_context(cafile=cafile)
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class Captions:
    """Live display: the growing caption line on a terminal, then each sentence with its statistics."""

    def __init__(self, out=sys.stdout, live: bool | None = None, as_json: bool = False, stats: bool = True,
                 words: bool = False, listeners=()):
        # words: every word and sentence message as a JSON line the moment it arrives (a program reading the
        # pipe: subtitles, a chat bridge), and a "restart" line where a reconnect sends a sentence again;
        # listeners: more readers of the words as they arrive, each with word(msg) and restart(sentence):
        # clients.subtitles.LiveSubtitles (--vtt, --srt), clients.caption_feed.CaptionFeed (--serve-captions)
        self.out, self.as_json, self.stats, self.words = out, as_json or words, stats, words
        self.listeners = list(listeners)
        self.live = (out.isatty() if live is None else live) and not self.as_json
        self.current: list[str] = []

    def _line(self, msg: dict) -> None:
        self.out.write(json.dumps(msg, ensure_ascii=False) + "\n")
        self.out.flush()

    def word(self, msg: dict) -> None:
        self.current.append(msg["text"])
        if self.words:
            self._line(msg)
        for listener in self.listeners:
            listener.word(msg)
        if self.live:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            line = " ".join(self.current)
            self.out.write("\r\033[K" + ("…" + line[-width + 1:] if len(line) > width else line))
            self.out.flush()

    def restart(self, sentence: int) -> None:
        """A reconnect: the unfinished sentences, from number `sentence` on, start again."""
        if self.live and self.current:
            self.out.write("\r\033[K")
        if self.words:   # (their words so far are void: they come again)
            self._line({"type": "restart", "sentence": sentence})
        for listener in self.listeners:
            listener.restart(sentence)
        self.current = []

    def sentence(self, msg: dict) -> None:
        self.current = []
        if self.as_json:
            self._line(msg)
            return
        if self.live:
            self.out.write("\r\033[K")
        self.out.write(msg["translation"] + "\n")
        if self.stats:
            lat = msg["latency"] or {}
            scores = "  ".join(f"{k} {v:.2f}" for k, v in lat.items()) or "no output"
            unread = f"  ({msg['unread_words']} words after the model ended the sentence: not translated)" \
                if msg.get("unread_words") else ""
            self.out.write(f"    [{msg['sentence']}] {msg['source_words']} source words  {scores}  "
                           f"compute {msg['compute_ms']:.1f} ms{unread}\n")
        self.out.flush()


# A server going away (stopped, restarted, its replica taken out) or a dropped connection: worth a new
# connection, which a load balancer sends to a live replica. Refusals come as fatal `error` messages first.
RECONNECT_CLOSE_CODES = {1001, 1006, 1012}


class _ConnectionLost(Exception):
    """The connection ended without `end` and may be reopened."""


class _Busy(Exception):
    """`start` was refused with `server_busy`: nothing was accepted; try again after `retry_after` s."""

    def __init__(self, msg: dict):
        super().__init__(msg["message"])
        self.msg, self.retry_after = msg, float(msg.get("retry_after") or 1.0)


async def _open(url: str, headers: dict, ssl_ctx, open_timeout: float):
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI
    try:
        return await connect(url, additional_headers=headers, ssl=ssl_ctx, open_timeout=open_timeout,
                             max_size=2 ** 22)
    except InvalidURI as e:
        raise ClientError(f"bad URL {url!r}: {e}", 2) from None
    except InvalidStatus as e:
        raise ClientError(f"{url} refused the websocket (HTTP {e.response.status_code}); is it a simulserve "
                          "server?", 2) from None
    except (OSError, TimeoutError, InvalidHandshake) as e:
        raise ClientError(f"cannot reach the server at {url}: {e or type(e).__name__}", 2) from None


async def stream_lines(url: str, lines, *, model=None, k=None, delta=None, wpm: float = 150.0,
                       auto_segment: bool = False, segmenter: str = "punct", end_after_pause: float | None = None,
                       share: bool = False, api_key: str | None = None,
                       ssl_ctx=None, captions: Captions | None = None, open_timeout: float = 10.0, reconnect: int = 3,
                       busy_wait: float = 300.0, warn=lambda text: print(text, file=sys.stderr)) -> Summary:
    """Stream `lines` (one sentence per line, or continuous text with auto_segment) and collect results.

    If the server goes away mid-stream (close code 1001/1012, or the connection drops), the client opens
    a new connection (up to `reconnect` times in a row) and sends again every sentence not yet translated,
    from its first word: nothing is lost, and the words of those unfinished sentences are dropped from the
    summary (their sentences restart). Sentence numbers continue across connections.

    Refused with `server_busy` (the model is at its real-time capacity), it waits the server's `retry_after`
    and tries again, for at most `busy_wait` seconds in a row (then ClientError, exit code 3)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    summary = Summary()
    it = iter(lines)
    # sent but not yet translated: non-auto, one word list per sentence; auto, one per `words` message
    # ([] stands for a blank line's end_sentence)
    pending: list[list[str]] = []
    failures = 0                              # reconnects in a row without a translated sentence
    busy_since: float | None = None           # refused with server_busy since then
    ws = await _open(url, headers, ssl_ctx, open_timeout)
    while True:
        before = len(summary.sentences)
        try:
            await _one_connection(ws, it, pending, summary, model=model, k=k, delta=delta, wpm=wpm,
                                  auto_segment=auto_segment, segmenter=segmenter, end_after_pause=end_after_pause,
                                  share=share, url=url, captions=captions, warn=warn)
            return summary
        except _Busy as e:
            now = time.monotonic()
            busy_since = busy_since or now
            if now + e.retry_after - busy_since > busy_wait:
                raise ClientError(f"{HINTS['server_busy']} ({busy_wait:g} s) [server_busy: {e}]", 3) from None
            warn(f"simulserve stream: the server is busy (server_busy): {e}")
            await asyncio.sleep(e.retry_after)
            ws = await _open(url, headers, ssl_ctx, open_timeout)
            continue
        except _ConnectionLost as e:
            busy_since = None
            failures = 1 if len(summary.sentences) > before else failures + 1
            if failures > reconnect:
                raise ClientError(f"{e}; gave up after {reconnect} reconnects", 5) from None
            done = len(summary.sentences)
            summary.words = [w for w in summary.words if w["sentence"] < done]
            if captions:
                captions.restart(done)
            warn(f"simulserve stream: {e}; reconnecting ({failures}/{reconnect}), "
                 f"{len(pending)} unfinished {'messages' if auto_segment else 'sentences'} will be sent again")
        while True:
            await asyncio.sleep(min(0.25 * 2 ** failures, 4.0))
            try:
                ws = await _open(url, headers, ssl_ctx, open_timeout)
                break
            except ClientError as e:
                if failures >= reconnect:
                    raise
                failures += 1
                warn(f"simulserve stream: {e}")


def _consume(pending: list[list[str]], msg: dict, auto_segment: bool) -> None:
    """Drop a translated sentence's words from the front of `pending`."""
    if not auto_segment:
        if pending:
            pending.pop(0)
        return
    n = msg["source_words"] + msg.get("unread_words", 0)
    while pending and n > 0:
        if len(pending[0]) <= n:
            n -= len(pending.pop(0))
        else:
            pending[0] = pending[0][n:]
            n = 0
    while pending and not pending[0]:      # the blank line that ended it
        pending.pop(0)


async def _one_connection(ws, it, pending, summary: Summary, *, model, k, delta, wpm, auto_segment, captions,
                          warn, segmenter: str = "punct", end_after_pause: float | None = None, share: bool = False,
                          url: str = "") -> None:
    """One websocket: send what `pending` holds, then the rest of `it`; return on `end`."""
    from websockets.exceptions import ConnectionClosed
    budget = asyncio.Condition()
    state = {"sent": 0, "done": 0, "limit": 128}
    base = len(summary.sentences)            # sentences finished on earlier connections

    async def wait_budget(n: int) -> None:
        """As-fast-as-possible mode keeps the server's backlog under half its limit."""
        async with budget:
            try:
                await asyncio.wait_for(budget.wait_for(lambda: state["sent"] - state["done"] + n <= state["limit"]
                                                       or state["sent"] == state["done"]), 5.0)
            except TimeoutError:
                pass

    async def send(msg: dict) -> None:
        await ws.send(json.dumps(msg, ensure_ascii=False))

    async def send_words(words: list[str], gap: float) -> None:
        if not words:                         # auto_segment: a blank line ends the sentence
            await send({"type": "end_sentence"})
            return
        if gap:
            for w in words:
                if "clock_started" not in state:
                    # this connection's first paced word is due now; after a reconnect the clock
                    # restarts there, so the pace goes on without a burst
                    state["clock_started"] = True
                    summary.clock_origin = time.monotonic() - (summary.paced + 1) * gap
                await send({"type": "words", "words": [w]})
                state["sent"] += 1
                summary.paced += 1
                # word n is due at origin + (n+1)·gap: a deadline, so the pace does not drift with the loop
                due = summary.clock_origin + (summary.paced + 1) * gap
                await asyncio.sleep(max(0.0, due - time.monotonic()))
        else:
            await wait_budget(len(words))
            await send({"type": "words", "words": words})
            state["sent"] += len(words)
        if not auto_segment:
            await send({"type": "end_sentence"})

    async def sender() -> None:
        start = {"type": "start", "auto_segment": auto_segment}
        if auto_segment and segmenter != "punct":    # a server older than the field still takes the default
            start["segmenter"] = segmenter
        if end_after_pause is not None:
            start["end_after_pause_s"] = end_after_pause
        start.update({key: v for key, v in (("model", model), ("k", k), ("delta", delta)) if v is not None})
        if share:   # (after a reconnect: the same feed, so the viewers' page goes on)
            start["share"] = summary.share["key"] if summary.share else True
        state["start"] = start
        await send(start)
        await ready.wait()
        for words in list(pending):           # a reconnect: the unfinished sentences again, at once
            await send_words(words, 0.0)
        gap = 60.0 / wpm if wpm > 0 else 0.0
        while (line := await asyncio.to_thread(next, it, None)) is not None:  # stdin may be a live pipe
            words = line.split()
            if not words and not auto_segment:
                continue
            pending.append(words)
            await send_words(words, gap)
        await send({"type": "end_stream"})

    async def receiver() -> None:
        async for raw in ws:
            msg = json.loads(raw)
            kind = msg.get("type")
            if kind == "ready":
                if msg.get("share") and msg["share"] != summary.share:
                    if summary.share:
                        warn("simulserve stream: the server no longer had the shared captions' feed: the viewers "
                             "need the new link")
                    summary.share = msg["share"]
                    warn(f"simulserve stream: viewers watch the captions at {watch_url(url, msg['share']['url'])}")
                summary.ready = msg
                summary.opened = summary.opened or time.monotonic()
                summary.connections.append(msg)
                state["limit"] = max(1, msg["limits"]["max_backlog_words"] // 2)
                ready.set()
            elif kind == "word":
                msg["sentence"] += base
                origin = summary.opened if summary.clock_origin is None else summary.clock_origin
                msg["received_s"] = time.monotonic() - origin
                summary.words.append(msg)
                if captions:
                    captions.word(msg)
            elif kind == "sentence":
                msg["sentence"] += base
                summary.sentences.append(msg)
                _consume(pending, msg, auto_segment)
                async with budget:
                    state["done"] += msg["source_words"]
                    budget.notify_all()
                if captions:
                    captions.sentence(msg)
            elif kind == "warning":
                summary.warnings.append(msg)
                warn(f"simulserve stream: warning {msg['code']}: {msg['message']}")
            elif kind == "error":
                code = msg["code"]
                if code == "server_busy":   # at `start`: nothing was sent yet; the caller waits and retries
                    raise _Busy(msg)
                if code == "bad_setting" and not ready.is_set() and summary.share and "share key" in msg["message"]:
                    # a restarted server lost the feed: a new one (its link is printed on `ready`)
                    await send({**state["start"], "share": True})
                    continue
                summary.errors.append(msg)
                if msg.get("fatal") or code in ("unknown_model", "bad_setting", "backlog_full",
                                                "sentence_too_long"):
                    raise ClientError(f"{HINTS.get(code, 'the server refused the stream')} "
                                      f"[{code}: {msg['message']}]", EXIT.get(code, 5))
                warn(f"simulserve stream: error {code}: {msg['message']}")
            elif kind == "end":
                return
        lost()

    def lost() -> None:
        code = ws.close_code
        text = f"the server closed the connection (code {code}{' ' + ws.close_reason if ws.close_reason else ''})"
        if code is None or code in RECONNECT_CLOSE_CODES:
            raise _ConnectionLost(text)
        raise ClientError(text, 5)

    ready = asyncio.Event()
    tasks = [asyncio.create_task(receiver()), asyncio.create_task(sender())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if t.exception() is not None:
                raise t.exception()
        await tasks[0]
    except ConnectionClosed:
        lost()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await ws.close()


def _asr_lines(src, stabilizer: Stabilizer | None):
    """stable_lines (--asr-json) or timed_lines (--asr-timed) over `src`, a bad line a ClientError (exit 2) that
    stops the stream."""
    try:
        yield from stable_lines(src, stabilizer) if stabilizer else timed_lines(src)
    except AsrInputError as e:
        raise ClientError(str(e), 2) from None


def register(sub) -> None:
    p = sub.add_parser(
        "stream", help="stream text to a simulserve server and show live captions",
        description="Send a text file (or stdin) to a simulserve server at a speaking rate and show the "
                    "captions as they are written.",
        epilog="examples:\n"
               "  simulserve stream talk.txt --model gma            # one sentence per line, 150 words per minute\n"
               "  cat notes.txt | simulserve stream --auto-segment   # continuous text, cut at . ! ?\n"
               "  simulserve stream talk.txt --url wss://mt.example.org/v1/stream --api-key KEY\n"
               "  asr | simulserve stream --auto-segment --words | my-subtitler   # JSON lines, word by word\n"
               "  simulserve stream talk.txt --auto-segment --vtt talk.en.vtt   # and WebVTT subtitles\n"
               "  recogniser | simulserve stream --asr-json --serve-captions 0.0.0.0:8080   # speech to an "
               "audience's screens\n"
               "exit codes: 0 done, 2 unreachable or not a simulserve server, 3 server full, loading or busy,\n"
               "4 API key or origin rejected, 5 any other refusal",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", nargs="?", help="text file, one sentence per line (default: stdin)")
    p.add_argument("--url", default=os.environ.get("SIMULSERVE_URL", DEFAULT_URL),
                   help=f"server websocket URL, ws:// or wss:// (default {DEFAULT_URL}; $SIMULSERVE_URL)")
    p.add_argument("--model", "-m", help="model name (GET /v1/models; default: the server's first)")
    p.add_argument("--k", type=int, help="wait-k lag (wait-k models)")
    p.add_argument("--delta", type=float, help="GMA relaxation offset δ (GMA models)")
    p.add_argument("--wpm", type=float, default=None, help="words per minute (default 150, with --asr-* 0; 0 = "
                                                           "as fast as they come or the server translates)")
    p.add_argument("--auto-segment", action="store_true", help="continuous text: the server cuts sentences "
                                                               "at . ! ? (a blank line also ends one)")
    p.add_argument("--segmenter", choices=("punct", "boundary"), default="punct",
                   help="with --auto-segment: punct (a sentence ends after . ! ? …, the default) or boundary (also "
                        "where the server's sentence-boundary classifier finds an end: titles, list items)")
    asr = p.add_mutually_exclusive_group()
    asr.add_argument("--asr-json", action="store_true",
                   help="the input is a speech recogniser's running results, one JSON object a line: "
                        "{\"partial\": TEXT} or {\"text\": TEXT} (final; Vosk's form). A word goes out once two "
                        "partial results in a row agree on it; a final result sends the rest and ends the sentence. "
                        "Implies --auto-segment and, unless given, --wpm 0")
    asr.add_argument("--asr-timed", action="store_true",
                     help="the input is a recogniser's committed text with its times, a line each: `EMITTED BEG END "
                          "text` or `BEG END text` (Whisper-Streaming's whisper_online.py and its server). The "
                          "times are dropped and the words go out as they come. Implies --auto-segment and, unless "
                          "given, --wpm 0")
    p.add_argument("--end-after-pause", type=float, metavar="S",
                   help="with --auto-segment: the server ends the open sentence when no words have come for S "
                        "seconds (a live pipe whose speaker paused: its last words are translated then)")
    p.add_argument("--api-key", default=os.environ.get("SIMULSERVE_API_KEY"), help="($SIMULSERVE_API_KEY)")
    p.add_argument("--cafile", help="CA bundle to verify a wss:// server")
    p.add_argument("--insecure", action="store_true", help="do not verify the wss:// certificate")
    p.add_argument("--reconnect", type=int, default=3, metavar="N",
                   help="when the server goes away mid-stream, reconnect up to N times in a row and send the "
                        "unfinished sentences again (default 3; 0 = never)")
    p.add_argument("--busy-wait", type=float, default=300.0, metavar="S",
                   help="refused with server_busy (the server is at its real-time capacity), try again after the "
                        "server's retry_after for up to S seconds in a row (default 300), then exit with 3")
    p.add_argument("--reference", metavar="FILE",
                   help="long form: the input is one talk (a source sentence per line, sent with no sentence "
                        "ends: use --auto-segment and a --wpm) and FILE its references; the output is re-aligned "
                        "to them with mweralign and BLEU and StreamLAAL are printed (docs/evaluation.md)")
    p.add_argument("--simulstream-log", metavar="DIR",
                   help="with --reference: write the talk's output as simulstream's scorers read it")
    p.add_argument("--json", action="store_true", help="print each sentence result as a JSON line")
    p.add_argument("--words", action="store_true",
                   help="print every word and sentence message as a JSON line as it arrives, for a program "
                        "reading the output ({\"type\": \"restart\", \"sentence\": N} where a reconnect sends "
                        "sentence N on again: its words come again)")
    p.add_argument("--vtt", metavar="FILE",
                   help="also write the translation as WebVTT subtitles, each word when it arrived (roll-up: "
                        "a recording of the talk played with FILE shows what the live audience saw); written as "
                        "the words come, one word behind, so a stopped stream keeps what it showed")
    p.add_argument("--srt", metavar="FILE", help="the same subtitles as --vtt in SubRip form (.srt: video editors, "
                                                  "burn-in tools); both may be given")
    p.add_argument("--share", action="store_true",
                   help="show the captions to viewers through the server: it prints the caption page's address "
                        "(http(s)://SERVER/watch/TOKEN/) to give the audience; a reconnect keeps the same feed")
    p.add_argument("--serve-captions", metavar="[HOST:]PORT",
                   help="also show the captions to an audience: serve a full-screen caption page at "
                        "http://HOST:PORT/ (HOST 127.0.0.1 unless given; 0.0.0.0 for other machines; PORT 0 takes a "
                        "free one) while the stream runs")
    p.add_argument("--no-stats", action="store_true", help="print translations only")
    p.add_argument("--no-live", action="store_true", help="no live caption line, even on a terminal")
    p.set_defaults(func=run)


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def run(args) -> int:
    files: list[LiveSubtitles] = []   # --vtt, --srt
    # SIGTERM (kill, a service manager) ends the stream as Ctrl-C does: the subtitle files get their last cue and
    # the viewers of --serve-captions are told the stream has ended
    signal.signal(signal.SIGTERM, _terminated)
    live_asr = args.asr_json or args.asr_timed
    if live_asr:   # (results come as they are spoken: no pace of the client's own)
        args.auto_segment = True
    if args.wpm is None:
        args.wpm = 0.0 if live_asr else 150.0
    try:
        url = normalize_url(args.url)
        if live_asr and args.reference:
            raise ClientError("--reference scores a talk read from a text file, not a recogniser's results", 2)
        if args.reference and not (args.auto_segment and args.wpm > 0 and args.input):
            raise ClientError("--reference scores a talk: give the talk's file, --auto-segment and a --wpm > 0", 2)
        if args.segmenter != "punct" and not args.auto_segment:
            raise ClientError(f"--segmenter {args.segmenter} chooses how --auto-segment cuts: add --auto-segment", 2)
        if args.end_after_pause is not None and not args.auto_segment:
            raise ClientError("--end-after-pause S ends --auto-segment's open sentence after a pause of S seconds: "
                              "add --auto-segment", 2)
        if args.end_after_pause is not None and not 0 < args.end_after_pause <= 3600:
            raise ClientError(f"--end-after-pause {args.end_after_pause:g}: give seconds, 0 < S <= 3600", 2)
        src = open(args.input, encoding="utf-8") if args.input else sys.stdin
        # (opened now: a path that cannot be written, or a port taken, fails before the stream, not after it)
        for form, path in (("vtt", args.vtt), ("srt", args.srt)):
            if path:
                files.append(LiveSubtitles(open(path, "w", encoding="utf-8"), form))
        feed = viewers = None
        if args.serve_captions:
            feed = CaptionFeed()
            viewers = CaptionServer(feed, *parse_address(args.serve_captions)).start()
            print(f"simulserve stream: captions for viewers at {viewers.url}", file=sys.stderr, flush=True)
    except (ClientError, OSError, ValueError) as e:
        for f in files:
            f.close()
        print(f"simulserve stream: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    captions = Captions(live=False if args.no_live else None, as_json=args.json, stats=not args.no_stats,
                        words=args.words, listeners=files + ([feed] if feed else []))
    summary = None
    asr = Stabilizer() if args.asr_json else None
    try:
        with src:
            summary = asyncio.run(stream_lines(
                url, _asr_lines(src, asr) if live_asr else (line for line in src), model=args.model, k=args.k,
                delta=args.delta, wpm=args.wpm,
                auto_segment=args.auto_segment, segmenter=args.segmenter, end_after_pause=args.end_after_pause,
                share=args.share, api_key=args.api_key,
                reconnect=args.reconnect, busy_wait=args.busy_wait,
                ssl_ctx=ssl_context(url, args.cafile, args.insecure), captions=captions))
    except ClientError as e:
        if captions.live and captions.current:
            print(file=sys.stdout)
        print(f"simulserve stream: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    finally:
        for f in files:   # the last word's cue; the cues before it are in the file already
            f.close()
        if viewers is not None:   # the viewers' pages say the stream has ended
            feed.end()
            viewers.close(feed)
    if asr is not None and asr.revised:
        print(f"simulserve stream: the recogniser revised {asr.revised} word(s) after they had been sent (they "
              "stay as first sent)", file=sys.stderr)
    if args.reference:
        return _score_talk(args, summary)
    lat = [s["latency"] for s in summary.sentences if s["latency"]]
    if lat and not (args.json or args.words) and not args.no_stats:
        means = "  ".join(f"{k} {sum(x[k] for x in lat) / len(lat):.2f}" for k in lat[0])
        print(f"{len(summary.sentences)} sentences, {len(summary.words)} words; mean {means}", file=sys.stderr)
    return 0


def _score_talk(args, summary: Summary) -> int:
    """--reference: the talk's output re-aligned to its references, scored as `evaluate --long-form` does."""
    from pathlib import Path

    from agents.longform import output_from_stream, score_talks, write_simulstream_logs
    from agents.talks import Talk

    with open(args.input, encoding="utf-8") as f:
        sources = [line.strip() for line in f if line.strip()]
    with open(args.reference, encoding="utf-8") as f:
        references = [line.strip() for line in f if line.strip()]
    if len(sources) != len(references):
        print(f"simulserve stream: {args.input} has {len(sources)} sentences, {args.reference} "
              f"{len(references)}", file=sys.stderr)
        return 2
    spw = 60.0 / args.wpm
    out = output_from_stream(Talk(Path(args.input).stem, "stream", sources, references),
                             summary.words, summary.sentences, boundary=args.segmenter == "boundary")
    scores = score_talks([out], spw)
    print(f"long form: {len(summary.sentences)} segments for {len(sources)} reference sentences; BLEU "
          f"{scores['BLEU']:.2f}, StreamLAAL {scores['StreamLAAL']:.2f} words ({scores['StreamLAAL_s']:.3f} s), "
          f"computation-aware {scores['StreamLAAL_CA']:.2f} words ({scores['StreamLAAL_CA_s']:.3f} s)",
          file=sys.stderr)
    if args.simulstream_log:
        write_simulstream_logs([out], spw, Path(args.simulstream_log))
        print(f"wrote simulstream logs to {args.simulstream_log}", file=sys.stderr)
    return 0
