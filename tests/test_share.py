"""Shared captions (server/share.py): a stream's captions for viewers at /watch/TOKEN/, on a real server, in one
process and behind --workers 2 (the feed then lives in the engine process, the viewers on either front end)."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from clients.subtitles import cues
from server.share import ShareError, ShareHub
from test_client import server   # noqa: F401 - the fixture (a server with an API key)
from test_container import nginx_front   # noqa: F401 - the fixture (Debian's nginx with docker/nginx.conf)
from test_server import LiveServer

START = {"type": "start", "model": "waitk", "k": 2, "auto_segment": True}


def lines_of(words: list[dict]) -> list[list[str]]:
    """What viewers should see after each word: the subtitles' roll-up (clients/subtitles.py)."""
    return [text.split("\n") for _, _, text in cues([{**w, "received_s": i} for i, w in enumerate(words)])]


def test_the_hub_rolls_lines_up_carries_a_feed_on_and_ends_it():
    sent = []
    hub = ShareHub(lambda watch, event: sent.append((watch, event)), 10.0)
    key, watch = hub.open(None)
    assert hub.last(watch) == {"lines": [], "ended": False} and hub.last("other") is None
    words = [(0, "Good"), (0, "morning."), (1, "We"), (1, "start")]
    for s, t in words:
        hub.word(key, s, t)
    hub.sentence(key, 0)
    assert [e["lines"] for _, e in sent] == lines_of([{"sentence": s, "text": t} for s, t in words])
    with pytest.raises(ShareError, match="still open"):
        hub.open(key)
    hub.left(key, ended=False, now=100.0)
    hub.expire(now=105.0)                                # within the grace time: the feed waits
    assert hub.open(key) == (key, watch)                 # the speaker is back: sentence 1 starts again
    assert sent[-1][1]["lines"] == ["Good morning."]
    hub.word(key, 0, "We")                               # (the new stream's sentence 0 is the feed's 1)
    hub.word(key, 0, "begin")
    hub.sentence(key, 0)
    assert sent[-1][1] == {"lines": ["Good morning.", "We begin"], "ended": False}
    hub.left(key, ended=False, now=200.0)
    hub.expire(now=210.0)                                # gone for the grace time: the viewers are told
    assert sent[-1][1] == {"lines": ["Good morning.", "We begin"], "ended": True}
    assert hub.last(watch) is None
    with pytest.raises(ShareError, match="unknown share key"):
        hub.open(key)
    other, _ = hub.open(None)
    hub.left(other, ended=True)                          # a stream's `end` ends its feed at once
    assert sent[-1][1]["ended"] and not hub.feeds
    # a feed another hub held, carried on here (server/ray_shares.py after its actor was lost): the same key and
    # watch token, its lines from the next word on; a key or token this hub knows is not taken over
    assert hub.adopt("k1", "w1") and hub.last("w1") == {"lines": [], "ended": False}
    assert not hub.adopt("k1", "w2") and not hub.adopt("k2", "w1")
    hub.word("k1", 3, "Weiter")
    assert sent[-1] == ("w1", {"lines": ["Weiter"], "ended": False})
    with pytest.raises(ShareError, match="still open"):
        hub.open("k1")


class Viewer(threading.Thread):
    """An SSE client of /watch/TOKEN/events on its own thread: its events, the response's status."""

    def __init__(self, http: str, watch: str):
        super().__init__(daemon=True)
        self.url, self.events, self.status, self.opened = f"{http}/watch/{watch}/events", [], None, threading.Event()
        self.front_end = self.server = self.error = None
        self.relayed = False

    def run(self) -> None:
        with httpx.stream("GET", self.url, timeout=60) as r:
            if r.status_code != 200:      # (read before `opened`: started() returns with it)
                self.error = json.loads(r.read())["error"]
            self.status, self.front_end = r.status_code, r.headers.get("x-simulserve-front-end")
            self.server = r.headers.get("x-simulserve-server")   # (behind Ray Serve: the replica)
            self.relayed = r.headers.get("x-simulserve-relayed") == "1"   # (from a share peer)
            self.opened.set()
            if r.status_code != 200:
                return
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))
                    if self.events[-1]["ended"]:
                        return

    def started(self) -> "Viewer":
        self.start()
        assert self.opened.wait(30)
        return self


async def speak(url: str, messages: list[dict], start: dict = START, end: bool = True):
    """A speaker stream: start, the messages, then end_stream (or leave without it); returns ready and words."""
    async with connect(url) as ws:
        await ws.send(json.dumps(start))
        ready = json.loads(await ws.recv())
        for m in messages:
            await ws.send(json.dumps(m))
        words = []
        if not end:
            await asyncio.sleep(0.5)
            return ready, words
        await ws.send(json.dumps({"type": "end_stream"}))
        async for raw in ws:
            msg = json.loads(raw)
            if msg["type"] == "word":
                words.append(msg)
        return ready, words


async def say_and_end(ws, words=("haus", "baum", "licht.", "wald")) -> list[dict]:
    """The shared speaker's last words and end_stream on its open websocket; its `word` messages until `end`."""
    await ws.send(json.dumps({"type": "words", "words": list(words)}))
    await ws.send(json.dumps({"type": "end_stream"}))
    got = []
    while (msg := json.loads(await ws.recv()))["type"] != "end":
        got += [msg] if msg["type"] == "word" else []
    return got


def check_shared_stream(srv, viewers: int = 2, fronts: int = 1) -> list:
    """The speaker shares; viewers watch from the start (at least `viewers`, on `fronts` front ends) and one joins
    late; a lost connection is carried on with the key; `end` ends the feed for everyone."""
    async def first_part():
        async with connect(srv.url) as ws:
            await ws.send(json.dumps({**START, "share": True}))
            ready = json.loads(await ws.recv())
            share = ready["share"]
            assert share["url"] == f"/watch/{share['watch']}/" and share["key"] != share["watch"]
            page = httpx.get(srv.http + share["url"])
            assert page.status_code == 200 and "EventSource" in page.text
            unslashed = httpx.get(srv.http + share["url"].rstrip("/"), follow_redirects=True)   # a link cut short
            assert unslashed.status_code == 200 and str(unslashed.url) == srv.http + share["url"]
            early = []
            while len(early) < viewers or len({v.front_end for v in early}) < fronts:
                early.append(Viewer(srv.http, share["watch"]).started())
                assert len(early) < 40
            assert srv.metric("simulserve_viewers") == len(early) and srv.metric("simulserve_shared_feeds") == 1
            await ws.send(json.dumps({"type": "words", "words": ["haus", "baum", "licht.", "wald"]}))
            words = []
            while True:   # until the first sentence is done (the fourth word's translation may come or not)
                msg = json.loads(await ws.recv())
                if msg["type"] == "word":
                    words.append(msg)
                if msg["type"] == "sentence":
                    return share, early, words
    share, early, before = asyncio.run(first_part())     # ...and the speaker's connection is lost
    assert all(v.status == 200 for v in early)
    late = Viewer(srv.http, share["watch"]).started()   # joins while the speaker is away
    _, after = asyncio.run(speak(srv.url, [{"type": "words", "words": ["wald", "stein", "wasser."]}],
                                 start={**START, "share": share["key"]}))
    for v in early + [late]:
        v.join(30)
    seen = [e["lines"] for e in early[0].events]
    assert all(v.events == early[0].events for v in early)
    first = " ".join(w["text"] for w in before if w["sentence"] == 0)
    # the roll-up of sentence 0's words, then the carried-on stream's (its sentence 0 is the feed's 1)
    assert seen[1:len(before) + 1][:sum(w["sentence"] == 0 for w in before)] == \
        lines_of([w for w in before if w["sentence"] == 0])
    assert seen[-1] == [first, " ".join(w["text"] for w in after)]
    assert early[0].events[-1]["ended"] and not any(e["ended"] for e in early[0].events[:-1])
    assert late.events[0]["lines"][0] == first            # the current text first
    assert late.events[-1] == early[0].events[-1]
    gone = Viewer(srv.http, share["watch"]).started()
    assert gone.status == 404                             # the feed has ended
    assert srv.metric("simulserve_shared_feeds") == 0
    for _ in range(100):   # (each viewer's response is let go of just after its last event)
        if srv.metric("simulserve_viewers") == 0:
            break
        time.sleep(0.05)
    assert srv.metric("simulserve_viewers") == 0
    return early


def check_sharing_mid_stream(srv) -> None:
    """`share` while the stream runs: the words written from then on reach viewers; `on: false` ends their feed at
    once (not after the grace time); `on: true` again opens a new feed."""
    async def go():
        async with connect(srv.url) as ws:
            await ws.send(json.dumps(START))
            assert json.loads(await ws.recv())["share"] is None
            await ws.send(json.dumps({"type": "share", "on": True, "id": 7}))
            shared = json.loads(await ws.recv())
            assert shared["type"] == "shared" and shared["id"] == 7
            first = shared["share"]
            assert first["url"] == f"/watch/{first['watch']}/"
            viewer = Viewer(srv.http, first["watch"]).started()
            await ws.send(json.dumps({"type": "share", "on": True}))           # on already: the same feed
            assert json.loads(await ws.recv()) == {"type": "shared", "share": first}
            await ws.send(json.dumps({"type": "words", "words": ["haus", "baum", "licht."]}))
            words = []
            while (msg := json.loads(await ws.recv()))["type"] != "sentence":
                words.append(msg)
            for _ in range(200):
                if viewer.events and viewer.events[-1]["lines"] == lines_of(words)[-1]:
                    break
                await asyncio.sleep(0.05)
            assert viewer.events[-1] == {"lines": lines_of(words)[-1], "ended": False}
            await ws.send(json.dumps({"type": "share", "on": False}))
            assert json.loads(await ws.recv()) == {"type": "shared", "share": None}
            viewer.join(10)
            assert viewer.events[-1]["ended"] and not viewer.is_alive()
            assert Viewer(srv.http, first["watch"]).started().status == 404
            await ws.send(json.dumps({"type": "share", "on": True}))
            again = json.loads(await ws.recv())["share"]
            assert again["watch"] != first["watch"]
            await ws.send(json.dumps({"type": "end_stream"}))
            while json.loads(await ws.recv())["type"] != "end":
                pass
        assert Viewer(srv.http, again["watch"]).started().status == 404    # `end` ended the new feed too
    asyncio.run(go())


def test_a_shared_stream_in_one_process(trained):
    with LiveServer(models={"waitk": str(trained["waitk"])}) as srv:
        check_shared_stream(srv)
        check_sharing_mid_stream(srv)

        async def refused():   # a key nobody holds, and a key whose stream is still open
            async with connect(srv.url) as ws:
                await ws.send(json.dumps({**START, "share": "no-such-key"}))
                error = json.loads(await ws.recv())
                assert error["code"] == "bad_setting" and "unknown share key" in error["message"]
            async with connect(srv.url) as a, connect(srv.url) as b:
                await a.send(json.dumps({**START, "share": True}))
                key = json.loads(await a.recv())["share"]["key"]
                await b.send(json.dumps({**START, "share": key}))
                error = json.loads(await b.recv())
                assert error["code"] == "bad_setting" and "still open" in error["message"]
        asyncio.run(refused())
        assert Viewer(srv.http, "no-such-feed").started().status == 404


def test_a_shared_stream_behind_two_front_ends(trained):
    """--workers 2: the feed lives in the engine process; viewers on either front end see the same events, the
    speaker carried on from whichever front end its new connection reaches."""
    from test_workers import WorkersServer
    with WorkersServer(models={"waitk": str(trained["waitk"])}) as srv:
        fronts = set()
        for _ in range(40):   # the kernel spreads connections over the front ends: find both
            v = Viewer(srv.http, "no-such-feed").started()
            assert v.status == 404
            fronts.add(v.front_end)
            if len(fronts) == 2:
                break
        assert len(fronts) == 2
        early = check_shared_stream(srv, fronts=2)
        assert {v.front_end for v in early} == fronts
        check_sharing_mid_stream(srv)


def test_the_client_shares_and_viewers_need_no_key(tmp_path, server):  # noqa: F811
    """`simulserve stream --share` prints the caption page's address; a viewer without the server's API key
    follows the stream to its end, its last lines those of the words the client got."""
    import os
    import subprocess
    import sys
    from models.data.synthetic import make_pairs
    from test_client import KEY, ROOT
    talk = tmp_path / "talk.txt"
    talk.write_text("\n".join(s for s, _ in make_pairs(5, min_len=3, max_len=6, seed=82)) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "stream", str(talk), "--url", server.url,
                             "--model", "waitk", "--k", "2", "--wpm", "300", "--words", "--share"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "SIMULSERVE_API_KEY": KEY},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "viewers watch the captions at http://127.0.0.1:" in line, line
        url = line.split(" at ")[1].strip()
        viewer = Viewer(server.http, url.rsplit("/watch/", 1)[1].strip("/")).started()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    viewer.join(30)
    assert httpx.get(url).status_code == 200
    words = [m for m in map(json.loads, out.splitlines()) if m["type"] == "word"]
    assert viewer.events[-1] == {"lines": lines_of(words)[-1], "ended": True}


def test_a_speaker_gone_for_the_grace_time_ends_the_feed_and_viewers_are_capped(trained, monkeypatch):
    import server.share as share
    monkeypatch.setattr(share, "EXPIRE_EVERY_S", 0.1)
    with LiveServer(models={"waitk": str(trained["waitk"])}, share_grace_s=3.0, max_viewers=1) as srv:
        ready, _ = asyncio.run(speak(srv.url, [{"type": "words", "words": ["haus", "baum"]}],
                                     start={**START, "share": True}, end=False))   # gone without `end`
        viewer = Viewer(srv.http, ready["share"]["watch"]).started()
        second = Viewer(srv.http, ready["share"]["watch"]).started()   # one more than max_viewers
        assert viewer.status == 200 and second.status == 503
        assert second.error == "this server process serves at most 1 viewers"
        viewer.join(10)
        assert viewer.events[-1]["ended"] and not viewer.is_alive()


def test_max_viewers_0_turns_sharing_off():
    from server.settings import load_settings
    from server.share import LocalShares
    shares = LocalShares(load_settings(max_viewers=0).limits)
    with pytest.raises(ShareError, match="does not share captions"):   # (start's share, or a `share` message)
        asyncio.run(shares.open(None))
    assert asyncio.run(LocalShares(load_settings().limits).open(None))


def test_a_stopping_server_ends_its_viewers_responses(trained):
    """A viewer's response never ends by itself while its feed lives: the server must end it when it stops,
    not wait for it."""
    import time
    srv = LiveServer(models={"waitk": str(trained["waitk"])}).__enter__()
    try:
        ready, _ = asyncio.run(speak(srv.url, [], start={**START, "share": True}, end=False))   # (120 s of grace)
        viewer = Viewer(srv.http, ready["share"]["watch"]).started()
        assert viewer.status == 200
        t = time.monotonic()
        srv.__exit__(None, None, None)
        viewer.join(10)
        assert not viewer.is_alive() and not srv.thread.is_alive() and time.monotonic() - t < 8
    finally:
        srv.__exit__(None, None, None)


def test_a_replica_relays_a_feed_its_peer_holds(trained):
    """Two servers as replicas behind a load balancer: a viewer who reaches the one without the speaker is
    relayed the feed from its peer (`share_peers`), to the end; a relayed request is never relayed again."""
    models = {"waitk": str(trained["waitk"])}
    with LiveServer(models=models) as a, \
            LiveServer(models=models, share_peers=[f"localhost:{a.port}", "127.0.0.1:9"]) as b:   # (9: no one)
        async def go():
            async with connect(a.url) as ws:
                await ws.send(json.dumps({**START, "share": True}))
                watch = json.loads(await ws.recv())["share"]["watch"]
                viewer = Viewer(b.http, watch).started()
                assert viewer.status == 200 and a.metric("simulserve_viewers") == 1   # (its relay, on a)
                again = httpx.get(f"{b.http}/watch/{watch}/events", headers={"X-Simulserve-Relay": "1"})
                assert again.status_code == 404                                      # b's own feeds only
                words = await say_and_end(ws)
            return viewer, words
        viewer, words = asyncio.run(go())
        viewer.join(30)
        assert viewer.events[-1] == {"lines": lines_of(words)[-1], "ended": True} and not viewer.is_alive()
        assert [e["lines"] for e in viewer.events] == [[]] + lines_of(words) + [lines_of(words)[-1]]
        assert Viewer(b.http, "no-such-feed").started().status == 404
        assert Viewer(b.http, "x%0d%0aHost:%20evil").started().status == 404   # not a token: no feed anywhere
        # a stopping replica ends its relayed viewers' responses too, rather than waiting for the peer's feed
        ready, _ = asyncio.run(speak(a.url, [], start={**START, "share": True}, end=False))   # (120 s of grace)
        c = LiveServer(models=models, share_peers=[f"127.0.0.1:{a.port}"]).__enter__()
        try:
            relayed = Viewer(c.http, ready["share"]["watch"]).started()
            assert relayed.status == 200
            t = time.monotonic()
            c.__exit__(None, None, None)
            relayed.join(10)
            assert not relayed.is_alive() and not c.thread.is_alive() and time.monotonic() - t < 8
        finally:
            c.__exit__(None, None, None)


def test_a_replica_follows_a_peer_feed_once_for_all_its_viewers(trained):
    """Three viewers of one feed on the replica without the speaker: one connection to the peer (its viewers'
    gauge says 1), each viewer every event; the last viewer gone, the connection closes; a peer that goes away
    mid-feed ends the viewers' responses without an end (their pages reconnect and look again)."""
    models = {"waitk": str(trained["waitk"])}
    a = LiveServer(models=models).__enter__()
    try:
        with LiveServer(models=models, share_peers=[f"127.0.0.1:{a.port}"]) as b:
            async def go():
                async with connect(a.url) as ws:
                    await ws.send(json.dumps({**START, "share": True}))
                    watch = json.loads(await ws.recv())["share"]["watch"]
                    viewers = [Viewer(b.http, watch).started() for _ in range(3)]
                    assert all(v.status == 200 and v.relayed for v in viewers)
                    assert a.metric("simulserve_viewers") == 1 and b.metric("simulserve_viewers") == 3
                    words = await say_and_end(ws)
                return viewers, words
            viewers, words = asyncio.run(go())
            for v in viewers:
                v.join(30)
                assert not v.is_alive() and v.events[-1] == {"lines": lines_of(words)[-1], "ended": True}
                assert [e["lines"] for e in v.events] == [[]] + lines_of(words) + [lines_of(words)[-1]]
            assert a.wait_metric("simulserve_viewers", 0) == 0 and b.wait_metric("simulserve_viewers", 0) == 0
            # viewers who leave: the last one gone, the peer's connection is closed
            ready, _ = asyncio.run(speak(a.url, [], start={**START, "share": True}, end=False))   # (120 s grace)
            watch = ready["share"]["watch"]
            with httpx.Client(timeout=30) as http:
                opened = [http.stream("GET", f"{b.http}/watch/{watch}/events") for _ in range(2)]
                lines = [o.__enter__().iter_lines() for o in opened]   # (kept: a dropped iterator closes)
                assert [next(r) for r in lines] == ['data: {"lines": [], "ended": false}'] * 2
                assert a.metric("simulserve_viewers") == 1
                for o in opened:
                    o.__exit__(None, None, None)
                assert b.wait_metric("simulserve_viewers", 0) == 0 and a.wait_metric("simulserve_viewers", 0) == 0
            # the peer stops: the viewers' responses end, with no `ended` event
            viewers = [Viewer(b.http, watch).started() for _ in range(2)]
            assert all(v.status == 200 for v in viewers) and a.metric("simulserve_viewers") == 1
            a.__exit__(None, None, None)
            for v in viewers:
                v.join(10)
                assert not v.is_alive() and v.events == [{"lines": [], "ended": False}]
            assert b.wait_metric("simulserve_viewers", 0) == 0
            assert Viewer(b.http, watch).started().status == 404
    finally:
        a.__exit__(None, None, None)


def test_a_viewer_gone_while_its_replica_looks_for_the_feed_leaves_no_follow(trained):
    """The first viewer of a peer's feed leaves while its replica asks the peers: the follow that the search
    opens has no viewer, and is closed (the peer's viewers' gauge back to 0)."""
    from server.share import Viewers
    from server.share_relay import PeerRelays
    with LiveServer(models={"waitk": str(trained["waitk"])}) as a:
        ready, _ = asyncio.run(speak(a.url, [], start={**START, "share": True}, end=False))
        relays = PeerRelays([f"127.0.0.1:{a.port}"], Viewers(10))

        async def go():
            viewer = asyncio.create_task(relays.subscribe(ready["share"]["watch"]))
            await asyncio.sleep(0)                       # (it asks the peers)
            viewer.cancel()
            while relays.opening:
                await asyncio.sleep(0.01)
            assert not relays.follows and viewer.cancelled()
            for _ in range(100):                         # (the follower's close reaches the peer)
                await asyncio.sleep(0.01)
        asyncio.run(go())
        assert a.wait_metric("simulserve_viewers", 0) == 0


def test_a_silent_peer_does_not_hold_a_relayed_viewer_up(trained, monkeypatch):
    """A peer that takes the connection and never answers (a hung replica): the viewer is relayed from the one
    that has the feed as soon as it answers, not after the silent one's time-out."""
    import socket
    import server.share_relay as share_relay
    monkeypatch.setattr(share_relay, "CONNECT_S", 20.0)
    models = {"waitk": str(trained["waitk"])}
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)                                      # the kernel accepts; nobody ever reads or writes
    try:
        with LiveServer(models=models) as a, LiveServer(models=models, share_peers=[
                f"127.0.0.1:{silent.getsockname()[1]}", f"127.0.0.1:{a.port}"]) as b:
            ready, _ = asyncio.run(speak(a.url, [], start={**START, "share": True}, end=False))
            t = time.monotonic()
            viewer = Viewer(b.http, ready["share"]["watch"]).started()
            assert viewer.status == 200 and viewer.relayed and time.monotonic() - t < 10
    finally:
        silent.close()


def test_viewers_through_nginx_reach_either_replica(trained, nginx_front):
    """Two replicas that name each other as share peers, behind Debian's nginx with docker/nginx.conf (least
    connections): the viewers nginx sends to the replica without the speaker are relayed, and every viewer gets
    the speaker's roll-up and the end."""
    from test_container import free_port
    models = {"waitk": str(trained["waitk"])}
    pa, pb = free_port(), free_port()
    with LiveServer(models=models, port=pa, share_peers=[f"127.0.0.1:{pb}"]), \
            LiveServer(models=models, port=pb, share_peers=[f"127.0.0.1:{pa}"]):
        front = nginx_front([pa, pb])

        async def go():
            async with connect(front.replace("http", "ws") + "/v1/stream") as ws:
                await ws.send(json.dumps({**START, "share": True}))
                watch = json.loads(await ws.recv())["share"]["watch"]
                viewers = []
                while {v.relayed for v in viewers} != {True, False}:
                    viewers.append(Viewer(front, watch).started())
                    assert viewers[-1].status == 200 and len(viewers) < 20
                words = await say_and_end(ws)
            return viewers, words
        viewers, words = asyncio.run(go())
        for v in viewers:
            v.join(30)
            assert v.events[-1] == {"lines": lines_of(words)[-1], "ended": True} and not v.is_alive()


def test_viewers_get_each_event_encoded_once_and_keep_alive_comments(monkeypatch):
    import server.share as share
    monkeypatch.setattr(share, "KEEPALIVE_S", 0.05)
    viewers = share.Viewers(10)

    async def go():
        a, b = viewers.add("w", {"lines": [], "ended": False}), viewers.add("w", {"lines": [], "ended": False})
        viewers.deliver("w", {"lines": ["Guten Tag"], "ended": False})
        first = [a.get_nowait(), a.get_nowait()]
        assert b.get_nowait() == first[0] and b.get_nowait()[0] is first[1][0]   # (the same text, made once)
        assert first[1] == ('data: {"lines": ["Guten Tag"], "ended": false}\n\n', False)
        ticker = asyncio.create_task(viewers.keep_alive_forever())
        assert await asyncio.wait_for(a.get(), 1) == (": keep-alive\n\n", False)
        ticker.cancel()
        viewers.deliver("w", {"lines": ["Guten Tag"], "ended": True})
        assert (await b.get())[1] or (await b.get())[1]                            # (after a keep-alive)
    asyncio.run(go())
