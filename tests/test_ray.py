"""`simulserve serve --ray` on a real local Ray cluster: a head node and a second node joined with
`ray start --address`, both on 127.0.0.1, and the `serve --ray` command deploying 2 replicas to it.

Through Ray's proxy, 24 concurrent streams (every policy) each equal `simulserve translate`; every
replica's health and metrics are reachable, and the metrics count exactly the sentences of the streams the
replica served. Then one replica's process is killed mid-stream: exactly its streams get a reconnect
close code and `simulserve stream` resumes them (on the other replica), translations unchanged; the other
streams see nothing; Serve replaces the replica. Shared captions reach viewers on both replicas, also
after the feeds' actor is killed, and a feed shared when it is killed goes on. A second deployment
autoscales from 1 to 2 replicas on open streams. Each time the command is stopped with Ctrl-C, and at the
end the cluster is shut down: no process of it is left (the test checks every process that carries its
marker).
About 95 s here once the tiny models are trained (the cluster's start is 20 s of it).

Ray's nodes talk to each other over the machine's own network address and listen on every interface,
whatever --node-ip-address says, and this project's tests send traffic to loopback addresses only. So the
cluster tests run in a network namespace of their own (`unshare -n`, loopback alone, as root): the test
`test_cluster_tests_run_in_their_own_network_namespace` runs them there in a child pytest, and they skip
anywhere else.
"""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

pytest.importorskip("ray")
pytest.importorskip("ray.serve")

from clients.stream import stream_lines  # noqa: E402
from models.data.synthetic import make_pairs  # noqa: E402
from test_server import assert_matches, make_reference, sentence_messages, talk  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MARKER = "SIMULSERVE_RAY_TEST"      # every process of the test's cluster inherits it (the stray check)
NETNS = "SIMULSERVE_RAY_NETNS"      # set in the child pytest that runs inside its own network namespace
in_own_netns = pytest.mark.skipif(os.environ.get(NETNS) != "1", reason="a Ray cluster test runs only inside "
                                  "its own network namespace (test_cluster_tests_run_in_their_own_network_namespace)")


def test_cluster_tests_run_in_their_own_network_namespace():
    """The cluster tests below, in a child pytest inside a new network namespace with only loopback up:
    nothing of Ray's can reach, or be reached from, any address but the namespace's own loopback."""
    if os.environ.get(NETNS) == "1":
        pytest.skip("this is the child run")
    if not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs unshare and ip (util-linux, iproute2)")
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here (root needed): {probe.stderr.strip()}")
    script = 'ip link set lo up && exec "$0" -m pytest -q -p no:cacheprovider -rs "$1" -k "ray_replicas or autoscales"'
    r = subprocess.run(["unshare", "-n", "sh", "-c", script, sys.executable, str(Path(__file__))], cwd=ROOT,
                       env={**os.environ, NETNS: "1"}, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert re.search(r"\b2 passed", r.stdout), r.stdout[-3000:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie has exited; only its exit status waits to be read)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def marked(tag: str) -> list[int]:
    """Running processes whose environment holds MARKER=tag."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and f"{MARKER}={tag}".encode() in (d / "environ").read_bytes().split(b"\0") \
                    and running(int(d.name)):
                out.append(int(d.name))
        except OSError:     # gone, or not ours to read
            pass
    return out


def stop(pids: list[int], timeout: float) -> list[int]:
    """SIGTERM, then SIGKILL what is left after `timeout` (as `ray stop` does, but only our processes);
    returns the ones that needed SIGKILL."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if running(p)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return alive


class LocalCluster:
    """A Ray head node and a second node on 127.0.0.1, started with the `ray` command."""

    def __init__(self):
        self.tag = uuid.uuid4().hex
        self.tmp = tempfile.mkdtemp(prefix="sray")        # short: Ray's unix sockets live under it
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Ray's proxy sends every request to a replica on its own node while that one takes more: with one
        # proxy (HeadOnly), streams are only spread across the nodes without that preference (docs/scaling.md)
        self.env = {**os.environ, MARKER: self.tag, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0",
                    "OMP_NUM_THREADS": "1", "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
                    # said outright: else Ray turns token auth on when a ~/.ray/auth_token happens to exist
                    # (a local `ray.init()` leaves one), and the second node must find the same token
                    "RAY_AUTH_MODE": "disabled",
                    # the proxy reports open requests to the autoscaler every second, not every 10
                    "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1"}

    def ray(self, *args: str) -> None:
        r = subprocess.run([str(BIN / "ray"), *args], env=self.env, timeout=120, capture_output=True, text=True)
        assert r.returncode == 0, f"ray {' '.join(args)}: {r.stdout[-2000:]}{r.stderr[-3000:]}"

    def start(self) -> "LocalCluster":
        def common():      # two nodes on one machine: each its own agent ports
            return ["--node-ip-address", "127.0.0.1", "--object-store-memory", str(80 * 2 ** 20),
                    "--disable-usage-stats", "--dashboard-agent-listen-port", str(free_port()),
                    "--metrics-export-port", str(free_port()), "--runtime-env-agent-port", str(free_port())]
        # 1 CPU a node: Serve's controller and proxy ask for none, a replica for 0.5
        self.ray("start", "--head", "--port", str(self.port), "--num-cpus", "1", "--include-dashboard=false",
                 "--ray-client-server-port", str(free_port()), "--temp-dir", self.tmp, *common())
        self.ray("start", "--address", self.address, "--num-cpus", "1", *common())
        return self

    def shutdown(self) -> list[int]:
        """Every process of the cluster (and of the drivers started with its environment) stopped;
        returns those that needed SIGKILL."""
        # nodes first, the GCS (the cluster's directory) last: a raylet that lost it waits for it to return
        pids = marked(self.tag)
        gcs = [p for p in pids if b"gcs_server" in Path(f"/proc/{p}/cmdline").read_bytes()[:300]]
        forced = stop([p for p in pids if p not in gcs], timeout=20) + stop(gcs, timeout=20)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return forced


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster()
    try:
        yield c.start()
    finally:
        c.shutdown()
        time.sleep(0.5)
        left = marked(c.tag)
        assert not left, f"stray processes of the Ray cluster: {left}"


class ServeRay:
    """`simulserve serve --ray` as a subprocess driver on the cluster."""

    def __init__(self, cluster: LocalCluster, models: dict[str, str], *scaling: str):
        self.port = free_port()
        self.http = f"http://127.0.0.1:{self.port}"
        self.url = f"ws://127.0.0.1:{self.port}/v1/stream"
        cmd = [sys.executable, "-m", "clients.cli", "serve", *(f"{n}={p}" for n, p in models.items()),
               "--ray", "--address", cluster.address, *(scaling or ("--replicas", "2")), "--num-cpus", "0.5",
               "--host", "127.0.0.1", "--port", str(self.port), "--rate-limit", "10000", "--rate-burst", "10000",
               "--graceful-shutdown-s", "2", "--log-level", "warning",
               "--step", "default",   # float32, as the references (serve's own default is int8 on a CPU)
               # every stream is admitted: these tests count replicas and streams, and a cold replica's
               # headroom estimate takes 4 (test_admission.py tests admission)
               "--no-admission"]
        self.log = open(Path(cluster.tmp) / "serve.log", "w+")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=cluster.env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_replicas(self, n: int, timeout: float = 120, without: str | None = None) -> list[dict]:
        """The replicas /v1/replicas lists, once there are n healthy ones (and `without` is gone)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                r = httpx.get(self.http + "/v1/replicas", timeout=10)
                if r.status_code == 200:
                    reps = r.json()["replicas"]
                    if len(reps) == n and all(x["health"]["status"] == "ok" for x in reps) \
                            and without not in {x["replica"] for x in reps}:
                        return reps
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"no {n} healthy replicas in {timeout:.0f} s\n{self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-4000:]

    def interrupt(self) -> int:
        """Ctrl-C: the command takes its application down and exits."""
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def scrape(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url, timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def sentences_served(replica: dict) -> float:
    return sum(v for k, v in scrape(replica["metrics_url"]).items() if k.startswith("simulserve_sentences_total"))


def check_shared_captions_across_replicas(serve: ServeRay, reps: list[dict]) -> None:
    """A speaker shares on one replica; Ray's proxy sends viewers to either: each gets the roll-up of the
    speaker's words and the end (the feeds live in one actor, server/ray_shares.py)."""
    import json
    from test_share import Viewer, lines_of
    from websockets.asyncio.client import connect

    async def speaker():
        async with connect(serve.url) as ws:
            await ws.send(json.dumps({"type": "start", "model": "waitk", "k": 2, "auto_segment": True,
                                      "share": True}))
            ready = json.loads(await ws.recv())
            viewers = []
            while len({v.server for v in viewers}) < 2:
                viewers.append(Viewer(serve.http, ready["share"]["watch"]).started())
                assert viewers[-1].status == 200 and len(viewers) < 40, [v.server for v in viewers]
            await ws.send(json.dumps({"type": "words", "words": ["haus", "baum", "licht.", "wald", "stein"]}))
            await ws.send(json.dumps({"type": "end_stream"}))
            words = []
            while (msg := json.loads(await ws.recv()))["type"] != "end":
                words += [msg] if msg["type"] == "word" else []
        return ready, viewers, words
    ready, viewers, words = asyncio.run(speaker())
    for v in viewers:
        v.join(30)
    assert {v.server for v in viewers} == {r["replica"] for r in reps}
    assert ready["server"] in {v.server for v in viewers}
    for v in viewers:
        assert v.events[-1] == {"lines": lines_of(words)[-1], "ended": True}, (v.server, v.events)
        assert not v.is_alive()
    assert Viewer(serve.http, ready["share"]["watch"]).started().status == 404   # ended, on any replica


KILL_SHARES = """
import sys, time, ray
ray.init(address=sys.argv[1], namespace=sys.argv[2], log_to_driver=False)
ray.kill(ray.get_actor(sys.argv[3]))
deadline = time.monotonic() + 30
while time.monotonic() < deadline:      # its name is free once it is dead
    try:
        ray.get_actor(sys.argv[3])
    except ValueError:
        break
    time.sleep(0.2)
else:
    sys.exit("the actor did not die")
while len(sys.argv) > 4 and time.monotonic() < deadline:   # a replica carries the feed on into a new actor
    try:
        if ray.get(ray.get_actor(sys.argv[3]).latest.remote(sys.argv[4])) is not None:
            break
    except ValueError:
        pass
    time.sleep(0.2)
else:
    if len(sys.argv) > 4:
        sys.exit("the feed was not carried on")
"""


def kill_shares_actor(cluster: LocalCluster, carried: str | None = None) -> None:
    """The shared captions' actor killed, as if its node were lost (server/ray_shares.py); with `carried` (a
    watch token), until a new actor holds that feed."""
    from server.ray_serve import NAMESPACE
    from server.ray_shares import SHARES
    r = subprocess.run([sys.executable, "-c", KILL_SHARES, cluster.address, NAMESPACE, SHARES,
                        *([carried] if carried else [])], env=cluster.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]


def check_a_shared_feed_outlives_its_actor(cluster: LocalCluster, serve: ServeRay) -> None:
    """A speaker shares, with viewers on both replicas; the actor is killed between two sentences. The speaker's
    replica carries the feed on into a new one (same watch token), and every viewer gets the next sentence's
    roll-up and the end, none an early end (the lines start again after the loss)."""
    import json
    from test_share import Viewer, lines_of, say_and_end
    from websockets.asyncio.client import connect

    async def speaker():
        async with connect(serve.url) as ws:
            await ws.send(json.dumps({"type": "start", "model": "waitk", "k": 2, "share": True}))
            watch = json.loads(await ws.recv())["share"]["watch"]
            viewers = []
            while len({v.server for v in viewers}) < 2:
                viewers.append(Viewer(serve.http, watch).started())
                assert viewers[-1].status == 200 and len(viewers) < 40, [v.server for v in viewers]
            await ws.send(json.dumps({"type": "words", "words": ["haus", "baum", "licht"]}))
            await ws.send(json.dumps({"type": "end_sentence"}))
            while json.loads(await ws.recv())["type"] != "sentence":
                pass
            await asyncio.to_thread(kill_shares_actor, cluster, watch)
            return viewers, await say_and_end(ws, ["wald", "stein", "berg"])
    viewers, words = asyncio.run(speaker())
    assert words and {w["sentence"] for w in words} == {1}
    for v in viewers:
        v.join(30)
        assert not v.is_alive() and v.events[-1] == {"lines": lines_of(words)[-1], "ended": True}, v.events
        assert not any(e["ended"] for e in v.events[:-1]), (v.server, v.events)


@pytest.mark.slow
@in_own_netns
def test_ray_replicas_stream_equal_translate_and_survive_a_replica_kill(cluster, trained):
    reference = make_reference(trained)
    models = {p: str(path) for p, path in trained.items()}
    serve = ServeRay(cluster, models)
    try:
        reps = serve.wait_replicas(2)
        assert len({r["pid"] for r in reps}) == 2
        assert len({r["node_id"] for r in reps}) == 2     # Serve spreads replicas: one on each node
        assert {r["monitor"].rsplit(":", 1)[0] for r in reps} == {"127.0.0.1"}    # as the proxy: loopback
        for r in reps:           # each replica's own health and Prometheus metrics
            assert httpx.get(r["health_url"]).json()["server"] == r["replica"]
            assert "simulserve_active_streams" in httpx.get(r["metrics_url"]).text
        targets = httpx.get(serve.http + "/v1/replicas/targets").json()
        assert sorted(t["targets"][0] for t in targets) == sorted(r["monitor"] for r in reps)
        assert httpx.get(serve.http + "/health").json()["status"] == "ok"

        # 24 concurrent streams through Ray's proxy, every policy: each equals `translate`
        settings = [("waitk", {"k": 2}), ("gma", {"delta": 1.0}), ("offline", {})]
        sents = [s for s, _ in make_pairs(24, min_len=4, max_len=10, seed=31)]
        jobs = [(settings[i % 3], sents[i]) for i in range(24)]
        before = {r["replica"]: sentences_served(r) for r in reps}

        async def one(i, policy, setting, sentence):
            await asyncio.sleep(0.05 * i)      # a little apart: the proxy's router sees the load
            return await talk(serve.url, [{"type": "start", "model": policy, **setting},
                                          *sentence_messages([sentence]), {"type": "end_stream"}])

        async def all_streams():
            return await asyncio.gather(*(one(i, p, st, s) for i, ((p, st), s) in enumerate(jobs)))
        results = asyncio.run(all_streams())
        served = {}
        for ((policy, setting), sentence), (received, code) in zip(jobs, results):
            assert code == 1000, received
            ready = received[0]
            assert ready["type"] == "ready" and ready["server"] in before
            served[ready["server"]] = served.get(ready["server"], 0) + 1
            assert_matches(received, [reference(policy, setting, sentence)], (policy, sentence))   # ready too
        assert set(served) == set(before), f"one replica served every stream: {served}"
        for r in reps:           # each replica's metrics count exactly the sentences it served
            assert sentences_served(r) - before[r["replica"]] == served[r["replica"]]
        check_shared_captions_across_replicas(serve, reps)
        # the actor lost: the next share and its viewers on either replica are served at once, by a new one,
        # and a feed shared when it was lost goes on in the new one
        kill_shares_actor(cluster)
        check_shared_captions_across_replicas(serve, reps)
        check_a_shared_feed_outlives_its_actor(cluster, serve)

        # kill one replica mid-stream: only its streams reconnect, and finish unchanged
        lines = [[s for s, _ in make_pairs(5, min_len=4, max_len=8, seed=100 + i)] for i in range(8)]
        notes: list[list[str]] = [[] for _ in lines]
        victim = reps[0]

        def kill():
            time.sleep(1.5)
            os.kill(victim["pid"], signal.SIGKILL)
        killer = threading.Thread(target=kill)

        async def speakers():
            async def one(i):
                await asyncio.sleep(0.1 * i)
                # reconnect=5: until Serve drops the dead replica, its proxy may answer a new connection with
                # HTTP 500 (3 tries, 3.5 s, ran out once here while the machine was busy with another test run)
                return await stream_lines(serve.url, lines[i], model="waitk", k=2, wpm=400, reconnect=5,
                                          warn=notes[i].append)
            killer.start()
            return await asyncio.gather(*(one(i) for i in range(len(lines))))
        summaries = asyncio.run(speakers())
        killer.join()
        hit = [i for i, s in enumerate(summaries) if s.connections[0]["server"] == victim["replica"]]
        spared = [i for i in range(len(lines)) if i not in hit]
        assert hit and spared, f"streams per replica: {[s.connections[0]['server'] for s in summaries]}"
        for i, s in enumerate(summaries):
            if i in hit:      # closed with a reconnect code (then a retry, should the proxy still pick the dead one)
                assert notes[i], f"stream {i} on the killed replica saw nothing"
                assert re.search(r"code 10(01|06|12)\).*reconnecting", notes[i][0]), notes[i]
                assert not [n for n in notes[i] if "warning" in n or "error " in n], notes[i]
                assert len(s.connections) >= 2 and s.connections[-1]["server"] != victim["replica"]
            else:
                assert notes[i] == [] and len(s.connections) == 1
            assert [x["translation"] for x in s.sentences] == \
                [reference("waitk", {"k": 2}, line).prediction for line in lines[i]]
        # Serve starts a new replica in its place; /v1/replicas drops the dead one
        reps2 = serve.wait_replicas(2, without=victim["replica"])
        assert victim["replica"] not in {r["replica"] for r in reps2}
    finally:
        code = serve.interrupt()
    assert code == 0, serve.output()


@pytest.mark.slow
@in_own_netns
def test_ray_autoscales_on_open_streams(cluster, trained):
    """1 replica, at most 2, 2 open streams per replica wanted: 5 open streams bring a second replica up,
    the streams already open stay where they are (nothing reconnects), new streams reach the new one."""
    reference = make_reference(trained)
    serve = ServeRay(cluster, {"waitk": str(trained["waitk"])}, "--min-replicas", "1", "--max-replicas", "2",
                     "--target-streams", "2", "--upscale-delay-s", "1")
    try:
        (first,) = serve.wait_replicas(1)
        lines = [[s for s, _ in make_pairs(6, min_len=5, max_len=8, seed=200 + i)] for i in range(5)]
        notes: list[list[str]] = [[] for _ in lines]
        grown: list[list[dict]] = []

        def watch():        # while the streams run: wait for the second replica, then open new streams
            reps = serve.wait_replicas(2, timeout=60)
            new = ({r["replica"] for r in reps} - {first["replica"]}).pop()
            sentence = make_pairs(1, min_len=4, max_len=6, seed=300)[0][0]
            deadline = time.monotonic() + 10     # the proxy learns of a new replica a moment after it is up
            while time.monotonic() < deadline:
                received, _ = asyncio.run(talk(serve.url, [{"type": "start", "model": "waitk", "k": 2},
                                                           *sentence_messages([sentence]), {"type": "end_stream"}]))
                assert_matches(received, [reference("waitk", {"k": 2}, sentence)])
                if received[0]["server"] == new:
                    break
                time.sleep(0.5)
            grown.extend([new, received[0]["server"]])
        watcher = threading.Thread(target=watch)

        async def speakers():
            watcher.start()
            return await asyncio.gather(*(stream_lines(serve.url, lines[i], model="waitk", k=2, wpm=150,
                                                       warn=notes[i].append) for i in range(len(lines))))
        summaries = asyncio.run(speakers())
        watcher.join(90)
        assert grown, "no second replica while 5 streams were open"
        new, served = grown
        assert served == new, "no new stream reached the new replica"
        for i, s in enumerate(summaries):
            assert notes[i] == [] and [c["server"] for c in s.connections] == [first["replica"]]
            assert [x["translation"] for x in s.sentences] == \
                [reference("waitk", {"k": 2}, line).prediction for line in lines[i]]
    finally:
        code = serve.interrupt()
    assert code == 0, serve.output()


def test_rayservice_manifest_matches_the_cli():
    """docs/kuberay-rayservice.yaml holds the deployment `serve --ray` makes from the flags it quotes."""
    from clients.cli import build_parser
    from server.cli import ray_options_from_args, settings_from_args
    from server.ray_serve import APP_NAME, DEPLOYMENT, deployment_options, replica_threads
    path = ROOT / "docs" / "kuberay-rayservice.yaml"
    text = path.read_text()
    manifest = yaml.safe_load(text)
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    command = re.search(r"^# equivalent: (simulserve serve .*)$", text, re.M).group(1).split()
    args = build_parser(command[1:]).parse_args(command[1:])
    opts, settings = ray_options_from_args(args), settings_from_args(args)
    settings = settings.model_copy(update={"torch_threads": replica_threads(settings, opts.num_cpus)})
    config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    from ray.serve.schema import ServeDeploySchema
    ServeDeploySchema.model_validate(config)   # Serve parses it (types, ranges; a misspelt key passes: see below)
    assert config["proxy_location"] == opts.proxy_location
    assert config["http_options"]["port"] == settings.port
    (application,) = config["applications"]
    assert application["name"] == APP_NAME and application["route_prefix"] == "/"
    assert application["import_path"] == "server.ray_serve:app"
    (deployment,) = application["deployments"]
    assert deployment == deployment_options(opts, settings) and deployment["name"] == DEPLOYMENT
    # the builder's arguments are the same server settings
    from server.settings import load_settings
    built = dict(application["args"])
    assert built.pop("monitor_port", 0) == opts.monitor_port
    assert load_settings(**built).model_dump(exclude={"host", "port"}) == settings.model_dump(exclude={"host", "port"})
    # the pods fit the replicas: GPUs and CPUs per worker pod, enough pods for the most replicas
    spec = manifest["spec"]["rayClusterConfig"]
    workers = spec["workerGroupSpecs"][0]
    limits = workers["template"]["spec"]["containers"][0]["resources"]["limits"]
    per_pod = min(float(limits["nvidia.com/gpu"]) // opts.num_gpus, float(limits["cpu"]) // opts.num_cpus)
    assert per_pod >= 1 and workers["maxReplicas"] * per_pod >= opts.max_replicas
    assert spec["rayVersion"] == __import__("ray").__version__


@pytest.mark.parametrize("argv,message", [
    (["--replicas", "2"], "--replicas need --ray"),
    (["--ray", "--replicas", "2", "--max-replicas", "3"], "not both"),
    (["--ray", "--min-replicas", "3", "--max-replicas", "2"], "1 <= --min-replicas <= --max-replicas"),
    (["--ray", "--proxy-location", "Nowhere"], "HeadOnly or EveryNode"),
])
def test_serve_ray_flags_are_checked_before_anything_starts(argv, message, capsys):
    from clients.cli import main
    assert main(["serve", "waitk", *argv]) == 2
    assert message in capsys.readouterr().err
