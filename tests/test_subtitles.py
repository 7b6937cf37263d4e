"""`simulserve stream --vtt`: WebVTT roll-up subtitles of the translation, each word when it arrived."""
from __future__ import annotations

import base64
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from clients.subtitles import HOLD_S, LINE_CHARS, LiveSubtitles, RollUp, cues, srt, timestamp, webvtt
from models.data.synthetic import make_pairs
from test_browser import browser   # noqa: F401 - the fixture
from test_client import KEY, ROOT, cli, reference, sentences, server   # noqa: F401 - the fixtures

CUE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d\d\d) --> (\d\d):(\d\d):(\d\d)\.(\d\d\d)$")


def word(sentence, text, t):
    return {"type": "word", "sentence": sentence, "text": text, "received_s": t}


def seconds(h, m, s, ms):
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def parse(vtt: str) -> list[tuple[float, float, str]]:
    """The cues of a WebVTT file, checking its shape: the header, then blocks of a timing line and text."""
    blocks = vtt.split("\n\n")
    assert blocks[0].rstrip("\n") == "WEBVTT"
    out = []
    for block in filter(None, blocks[1:]):
        timing, text = block.split("\n", 1)
        m = CUE.match(timing)
        assert m, timing
        out.append((seconds(*m.groups()[:4]), seconds(*m.groups()[4:]), text.rstrip("\n")))
    return out


def test_roll_up_cues_show_the_last_two_lines_until_the_next_word():
    long = ["wordy"] * 9                        # 9 × 6 - 1 = 53 characters: over one line
    words = [word(0, "Click", 1.0), word(0, "Save", 1.4), word(0, "now.", 1.4),   # two in one step
             word(1, "A", 2.0)] + [word(1, w, 3.0 + i) for i, w in enumerate(long)] + [word(2, "<b>&", 30.0)]
    got = cues(words)
    assert got[0] == (1.0, 1.4, "Click")
    assert got[1] == (1.4, 2.0, "Click Save now.")      # the step's two words: one cue, the last one's text
    assert got[2] == (2.0, 3.0, "Click Save now.\nA")   # a sentence starts a line
    lines = [c[2].split("\n") for c in got]
    assert all(len(line) <= LINE_CHARS for ls in lines for line in ls) and all(len(ls) <= 2 for ls in lines)
    assert got[-2][1] == got[-2][0] + HOLD_S            # a long silence: the text goes after HOLD_S
    assert got[-1] == (30.0, 30.0 + HOLD_S, got[-2][2].split("\n")[-1] + "\n<b>&")
    assert parse(webvtt(words)) == escaped(got)
    assert timestamp(3661.5) == "01:01:01.500" and timestamp(0.0004) == "00:00:00.000"


def escaped(got):
    return [(a, b, t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")) for a, b, t in got]


class Kept(io.StringIO):
    def close(self):   # (the test reads what was written after the writer closed it)
        self.final = self.getvalue()
        super().close()


def test_the_live_file_is_the_whole_file_written_one_word_behind():
    """Word by word, the live writer's file holds exactly the cues that are complete (those of words before the
    last one's arrival time), each a cue of the file written from all words; closed, it is that file."""
    rng = __import__("random").Random(7)
    t, words = 0.0, []
    for i in range(300):
        t += rng.choice([0.0, 0.0004, 0.2, 0.7, 6.0])      # same step, under a millisecond, spoken, a pause
        words.append(word(i // 9, rng.choice(["a", "word", "longer-word", "<&>", "Zürich"]), t))
    whole = webvtt(words)
    want = parse(whole)
    out = Kept()
    live = LiveSubtitles(out)
    assert parse(out.getvalue()) == []                    # a valid file before any word
    for k, w in enumerate(words, 1):
        live.word(w)
        shown = round(w["received_s"] * 1000)
        assert parse(out.getvalue()) == [c for c in want if round(c[0] * 1000) < shown], k
    live.close()
    assert out.final == whole
    live.close()                                          # a second close does nothing
    # SubRip: the same cues, numbered, the text unescaped; written live, the same file
    out = Kept()
    live = LiveSubtitles(out, "srt")
    for w in words:
        live.word(w)
    live.close()
    assert out.final == srt(words)
    assert [(a, b, t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
            for a, b, t in parse_srt(out.final)] == want


def parse_srt(text: str) -> list[tuple[float, float, str]]:
    """The cues of a SubRip file, checking its shape: numbered blocks 1, 2, … of a timing line and text."""
    out = []
    for n, block in enumerate(filter(None, text.split("\n\n")), 1):
        number, timing, body = block.split("\n", 2)
        assert number == str(n)
        m = CUE.match(timing.replace(",", "."))
        assert m and timing.count(",") == 2, timing
        out.append((seconds(*m.groups()[:4]), seconds(*m.groups()[4:]), body.rstrip("\n")))
    return out


MARKUP = re.compile(r"<[A-Za-z/]|\{\\|-->")   # what SubRip players read as markup or a timing line


def test_subrip_text_that_looks_like_markup_stays_text():
    """SubRip has no escapes: <b>, {\\an8} or --> in a word (a source word copied through <unk>) would be
    read as markup or a timing line; a zero-width space keeps each as text, and nothing else changes."""
    texts = ["<b>fett</b>", "{\\an8}oben", "a-->b", "x < y", "a -> b", "<unk>", "Tom&Jerry", "<", "->"]
    words = [word(0, t, 1.0 + 0.5 * i) for i, t in enumerate(texts)]
    out = Kept()
    live = LiveSubtitles(out, "srt")
    for w in words:
        live.word(w)
    live.close()
    got = parse_srt(out.final)
    assert got and out.final == srt(words)
    assert [(a, b, t.replace("\u200b", "")) for a, b, t in got] == cues(words)   # the same text, seen
    assert not any(MARKUP.search(t) for _, _, t in got)
    assert "\u200b" not in "".join(t for _, _, t in parse_srt(srt([word(0, t, 1.0) for t in ("x < y", "a -> b")])))


def test_a_restart_starts_the_sentence_on_a_new_line_and_keeps_what_was_shown():
    roll = RollUp()
    for i, w in enumerate(["Good", "morning", "everyone"]):
        roll.add(word(0, w, 1.0 + i))
    assert roll.add(word(1, "We", 4.0)) == (3.0, 4.0, "Good morning everyone")
    roll.add(word(1, "start", 4.5))
    roll.restart(1)                                       # sentence 1 again, from its first word
    assert roll.add(word(1, "We", 9.0)) == (4.5, 9.0, "Good morning everyone\nWe start")   # as shown
    assert roll.add(word(1, "start", 9.5)) == (9.0, 9.5, "Good morning everyone\nWe")
    assert roll.finish() == (9.5, 9.5 + HOLD_S, "Good morning everyone\nWe start")
    assert roll.finish() is None


def test_a_path_that_cannot_be_written_fails_before_the_stream(server, tmp_path):  # noqa: F811
    r = cli("stream", "--url", server.url, "--vtt", str(tmp_path / "no" / "such" / "dir.vtt"), stdin="haus\n",
            SIMULSERVE_API_KEY=KEY)
    assert r.returncode == 2 and "dir.vtt" in r.stderr and r.stdout == ""


def test_stream_writes_the_words_as_they_arrived(server, sentences, reference, tmp_path):  # noqa: F811
    """A real server and client: --vtt beside --words; every word's arrival starts a cue ending in that word,
    and the last cue of each sentence holds its translation's last words. Paced (speaker's clock) and not."""
    lines, path = sentences
    for wpm in ("600", "0"):
        vtt, sub = tmp_path / f"talk{wpm}.vtt", tmp_path / f"talk{wpm}.srt"
        r = cli("stream", str(path), "--url", server.url, "--model", "waitk", "--k", "2", "--wpm", wpm, "--words",
                "--vtt", str(vtt), "--srt", str(sub), timeout=120, SIMULSERVE_API_KEY=KEY)
        assert r.returncode == 0, r.stderr
        assert parse_srt(sub.read_text(encoding="utf-8")) == parse(vtt.read_text(encoding="utf-8"))   # (no escapes)
        got = [json.loads(line) for line in r.stdout.splitlines()]
        words = [m for m in got if m["type"] == "word"]
        assert words and all(m["received_s"] >= 0 for m in words)
        parsed = parse(vtt.read_text(encoding="utf-8"))
        at: dict[str, dict] = {}     # the last word that arrived at each (millisecond) time
        for w in words:
            at[timestamp(w["received_s"])] = w
        assert [timestamp(a) for a, _, _ in parsed] == list(at)      # a cue where words arrived, in order
        for (start, _, text), last in zip(parsed, at.values()):      # ...ending with the word that arrived then
            assert text.endswith(last["text"]) and text.split("\n")[-1] in " ".join(
                w["text"] for w in words if w["sentence"] == last["sentence"])
        for i, line in enumerate(lines):   # each sentence's last cue line ends its translation
            final = [t for (a, _, t), w in zip(parsed, at.values()) if w["sentence"] == i][-1]
            assert reference("waitk", {"k": 2}, line).prediction.endswith(final.split("\n")[-1])


@pytest.mark.parametrize("stop, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_file_grows_during_the_stream_and_survives_ctrl_c(server, tmp_path, stop, code):  # noqa: F811
    """A real client and server: the file holds cues while the stream still runs, and a client stopped with
    SIGINT (Ctrl-C) or SIGTERM leaves a valid file with a cue for every word it had received (the last one held
    HOLD_S)."""
    talk = tmp_path / "long.txt"
    talk.write_text("\n".join(s for s, _ in make_pairs(40, min_len=4, max_len=8, seed=61)) + "\n")
    vtt = tmp_path / "live.vtt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SIMULSERVE_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "stream", str(talk), "--url", server.url,
                             "--model", "waitk", "--k", "2", "--wpm", "240", "--words", "--vtt", str(vtt)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # (a shell's background job ignores SIGINT, and its children inherit that)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not vtt.exists() or len(parse(vtt.read_text())) < 3):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        during = parse(vtt.read_text())
        assert len(during) >= 3 and proc.poll() is None    # cues in the file while the stream runs
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    words = [m for m in map(json.loads, out.splitlines()) if m["type"] == "word"]
    final = parse(vtt.read_text())
    assert final[:len(during)] == during and len(final) > len(during)
    # every word received, the last one's cue too (or but the last word, where SIGINT came between the two writes)
    assert final in (parse(webvtt(words)), parse(webvtt(words[:-1])))
    assert final[-1][1] == pytest.approx(final[-1][0] + HOLD_S, abs=2e-3)


@pytest.mark.browser
def test_chromium_reads_the_file_as_written(browser):  # noqa: F811
    """A real WebVTT parser (Chromium's, through a <track>) finds every cue with its times and text."""
    words = [word(0, t, 1.0 + 0.5 * i) for i, t in enumerate("Click Save to <save> & go on reading this".split())]
    words += [word(1, t, 9.0 + 0.25 * i) for i, t in enumerate("Second sentence, a longer one, over two lines "
                                                               "of text for the roll-up".split())]
    data = base64.b64encode(webvtt(words).encode()).decode()
    page = browser.new_page()
    try:
        page.set_content(f"""<!doctype html><video></video><script>
            const track = document.createElement("track");
            track.kind = "subtitles"; track.src = "data:text/vtt;base64,{data}";
            document.querySelector("video").appendChild(track);
            track.track.mode = "hidden";
            track.onload = () => {{ window.cues = Array.from(track.track.cues, (c) =>
                [c.startTime, c.endTime, Array.from(c.getCueAsHTML().childNodes, (n) => n.textContent).join("")]); }};
            track.onerror = () => {{ window.cues = "error"; }};
        </script>""")
        page.wait_for_function("window.cues !== undefined", timeout=10_000)
        got = page.evaluate("window.cues")
    finally:
        page.close()
    want = cues(words)
    assert got != "error" and len(got) == len(want)
    for (a, b, text), (x, y, t) in zip(got, want):
        assert a == pytest.approx(x, abs=1e-3) and b == pytest.approx(y, abs=1e-3) and text == t
