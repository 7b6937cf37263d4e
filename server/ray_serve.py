"""simulserve as a Ray Serve deployment: `simulserve serve --ray` (docs/scaling.md).

Each replica is a Ray actor running the very app of `simulserve serve` (server/app.py): its own models,
cache pool and batching engine. Ray's proxy carries each websocket to one replica for its whole life
(a stream's state lives in that replica's engine) and places, restarts and scales the replicas.

A replica also answers /health and /metrics on a port of its own (the monitor), so that every replica can
be probed and scraped, not the one the proxy happens to pick; GET /v1/replicas (through the proxy) lists
them all, with their health, and /v1/replicas/targets is a Prometheus http_sd target list.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import threading
import urllib.request
from dataclasses import dataclass

import ray
from ray import serve

from server.settings import ServerSettings

log = logging.getLogger("simulserve.ray")
APP_NAME = "simulserve"
DEPLOYMENT = "simulserve"
NAMESPACE = "simulserve"             # the Ray namespace of the driver and of the replica registry
REGISTRY = "simulserve-replicas"     # named actor: replica id -> where its monitor answers
SERVE_NAMESPACE = "serve"            # where Serve names its replica actors (by their full replica id)


@dataclass
class RayOptions:
    """How the deployment is placed and scaled (the `serve --ray` flags; the RayService manifest's
    `deployments` entry holds the same fields, tests/test_ray.py checks it)."""
    address: str | None = None        # a running cluster (HOST:PORT or auto); None: start a local one
    replicas: int | None = None       # fixed replica count; None with max_replicas: autoscaling
    min_replicas: int = 1
    max_replicas: int | None = None
    target_streams: float = 32.0      # autoscaling: open streams per replica to aim for
    upscale_delay_s: float = 30.0     # autoscaling: how long more replicas must be wanted before they start
    downscale_delay_s: float = 600.0  # ... and fewer before one is taken out (its streams then reconnect)
    num_cpus: float = 1.0             # per replica
    num_gpus: float = 0.0             # per replica (1: one replica per GPU)
    monitor_port: int = 0             # each replica's /health and /metrics port (0: any free port)
    graceful_shutdown_s: float = 20.0  # a replica taken out waits this long for its streams to end
    proxy_location: str = "HeadOnly"  # HeadOnly or EveryNode

    def check(self) -> None:
        if self.replicas is not None and self.max_replicas is not None:
            raise ValueError("give --replicas (a fixed count) or --max-replicas (autoscaling), not both")
        if self.replicas is not None and self.replicas < 1:
            raise ValueError("--replicas must be at least 1")
        if self.max_replicas is not None and not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError("autoscaling needs 1 <= --min-replicas <= --max-replicas")
        if self.target_streams <= 0 or self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError("--target-streams must be > 0, --num-cpus and --num-gpus >= 0")
        if self.upscale_delay_s < 0 or self.downscale_delay_s < 0:
            raise ValueError("--upscale-delay-s and --downscale-delay-s must be >= 0")
        if self.proxy_location not in ("HeadOnly", "EveryNode"):
            raise ValueError("--proxy-location is HeadOnly or EveryNode")


def deployment_options(opts: RayOptions, settings: ServerSettings) -> dict:
    """Keyword arguments of serve.deployment: replicas, resources, and the limits a websocket needs."""
    out = {
        "name": DEPLOYMENT,
        "ray_actor_options": {"num_cpus": opts.num_cpus, "num_gpus": opts.num_gpus},
        # A websocket is one request for as long as it is open: the replica's stream limit, not Serve's
        # default of a handful, is what may be open at once (then `server_full`).
        "max_ongoing_requests": settings.limits.max_streams,
        "graceful_shutdown_timeout_s": opts.graceful_shutdown_s,
        "health_check_period_s": 5.0,
    }
    if opts.max_replicas is not None:
        out["autoscaling_config"] = {"min_replicas": opts.min_replicas, "max_replicas": opts.max_replicas,
                                     "target_ongoing_requests": opts.target_streams,
                                     "upscale_delay_s": opts.upscale_delay_s,
                                     "downscale_delay_s": opts.downscale_delay_s}
    else:
        out["num_replicas"] = opts.replicas or 1
    return out


def replica_threads(settings: ServerSettings, num_cpus: float) -> int:
    """torch threads per replica: the CPUs it asked for (at least one), unless set."""
    return settings.serving.torch_threads or max(1, int(num_cpus))


# ------------------------------------------------------------------ the replica registry
@ray.remote(num_cpus=0)
class _Registry:
    """Where each replica's monitor answers. A replica adds itself once loaded and removes itself when it
    stops; one that died without a word is dropped by the first /v1/replicas that cannot reach it."""

    def __init__(self):
        self.replicas: dict[str, dict] = {}

    def add(self, replica: str, info: dict) -> None:
        self.replicas[replica] = info

    def remove(self, replica: str) -> None:
        self.replicas.pop(replica, None)

    def all(self) -> dict[str, dict]:
        return dict(self.replicas)


def registry():
    return _Registry.options(name=REGISTRY, namespace=NAMESPACE, lifetime="detached",
                             get_if_exists=True).remote()


def _get_json(url: str, timeout: float = 3.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:          # 503 while loading: still an answer
        return json.loads(e.read() or b"null")


def _add_replica_routes(app, srv) -> None:
    from fastapi.responses import JSONResponse

    async def listed() -> list[dict]:
        known = await registry().all.remote()
        return [r for r in await asyncio.gather(*(probe(rid, info) for rid, info in sorted(known.items())))
                if r is not None]

    async def probe(rid: str, info: dict) -> dict | None:
        try:                                       # Serve's actor for the replica: gone once it died
            await asyncio.to_thread(ray.get_actor, rid, namespace=SERVE_NAMESPACE)
        except ValueError:
            await registry().remove.remote(rid)
            log.info("replica %s is gone: dropped from the registry", rid)
            return None
        try:
            health = await asyncio.to_thread(_get_json, info["health_url"])
        except OSError as e:                       # alive to Ray, but its monitor does not answer (now)
            health = {"status": "unreachable", "error": str(e)}
        return {**info, "health": health}

    @app.get("/v1/replicas", summary="every replica (Ray Serve): its health, and where its /metrics is")
    async def replicas():
        return {"replicas": await listed()}

    @app.get("/v1/replicas/targets", summary="every replica's monitor as a Prometheus http_sd target list")
    async def targets():
        return JSONResponse([{"targets": [r["monitor"]],
                              "labels": {"replica": r["replica"], "node": r["node"]}} for r in await listed()])


def monitor_app(srv):
    """/health and /metrics of one replica, served on its own port (no streams: those come by the proxy)."""
    from fastapi import FastAPI
    from fastapi.responses import Response
    from server.app import health_response
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.get("/health")(lambda: health_response(srv))
    app.get("/metrics")(lambda: Response(srv.metrics.render(), media_type=srv.metrics.content_type))
    return app


@serve.ingress()
class SimulServe:
    """One replica: the app of `simulserve serve`, and its monitor."""

    def __init__(self, settings: dict, monitor_port: int = 0):
        self.settings = ServerSettings.model_validate(settings)
        self.replica = serve.get_replica_context().replica_id.to_full_id_str()
        self.node_id = ray.get_runtime_context().get_node_id()
        # the address the node was started with (`ray start --node-ip-address`), not a guess from the routes
        self.node = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == self.node_id),
                         None) or ray.util.get_node_ip_address()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # the monitor listens where the proxy does: loopback stays loopback (a local-only deployment)
        host = self.settings.transport.host
        self.monitor_host = host if host in ("127.0.0.1", "::1", "localhost") \
            else self.node
        self.sock.bind((self.monitor_host, monitor_port))
        self.monitor = None

    async def __serve_build_asgi_app__(self):
        from server.app import create_app
        from server.ray_shares import RayShares
        app = create_app(self.settings, wait_for_models=True, extend=_add_replica_routes)
        self.srv = app.state.server
        self.srv.server_id = self.replica
        # shared captions: the feeds in one actor, so that a viewer may reach any replica (server/ray_shares.py)
        self.srv.shares = RayShares(self.settings.limits, self.srv.metrics, NAMESPACE)
        await self._start_monitor()
        return app

    async def _start_monitor(self) -> None:
        import uvicorn
        self.monitor = uvicorn.Server(uvicorn.Config(monitor_app(self.srv), lifespan="off", log_level="warning",
                                                     access_log=False))
        threading.Thread(target=self.monitor.run, kwargs={"sockets": [self.sock]}, daemon=True).start()
        port = self.sock.getsockname()[1]
        base = f"http://{self.monitor_host}:{port}"
        # registered now; /v1/replicas reports it loading until the models are in
        await registry().add.remote(self.replica, {
            "replica": self.replica, "node": self.node, "node_id": self.node_id, "pid": os.getpid(),
            "monitor": f"{self.monitor_host}:{port}",
            "health_url": base + "/health", "metrics_url": base + "/metrics"})

    def check_health(self) -> None:
        """Serve restarts a replica whose models failed to load."""
        if getattr(self, "srv", None) is not None and self.srv.load_error:
            raise RuntimeError(self.srv.load_error)

    def __del__(self):
        try:
            registry().remove.remote(self.replica)
        except Exception:  # noqa: BLE001 - the cluster is going down with us
            pass
        if self.monitor is not None:
            self.monitor.should_exit = True


# ------------------------------------------------------------------ deploying
def deploy(settings: ServerSettings, opts: RayOptions, *, host: str, port: int, blocking: bool = False):
    """Connect to (or start) a cluster, start Serve's proxy on host:port and deploy. Returns once every
    replica is running (their models loaded)."""
    opts.check()
    if not ray.is_initialized():
        # no --address: a new local cluster ("local"), never one a stale /tmp/ray file points to
        ray.init(address=opts.address or "local", namespace=NAMESPACE, log_to_driver=False,
                 **({} if opts.address else {"include_dashboard": False}))
    serve.start(proxy_location=opts.proxy_location, http_options={"host": host, "port": port})
    settings = settings.model_copy(update={"torch_threads": replica_threads(settings, opts.num_cpus)})
    application = serve.deployment(SimulServe).options(**deployment_options(opts, settings)).bind(
        settings.model_dump(mode="json"), opts.monitor_port)
    serve.run(application, name=APP_NAME, route_prefix="/", blocking=blocking)


def app(args: dict):
    """The application builder of a Serve config file (`import_path: server.ray_serve:app`, the RayService
    manifest in docs/kuberay-rayservice.yaml): `args` are server settings (as in a --config YAML file) plus
    `monitor_port`; replicas, resources and autoscaling come from the config's `deployments` entry."""
    from server.settings import load_settings
    args = dict(args or {})
    monitor_port = int(args.pop("monitor_port", 0))
    args.setdefault("host", "0.0.0.0")     # only the monitors use it here: reachable on the node's address
    settings = load_settings(**args)
    return serve.deployment(SimulServe).options(name=DEPLOYMENT).bind(settings.model_dump(mode="json"),
                                                                     monitor_port)


def replicas() -> dict[str, dict]:
    """Registered replicas (from the driver)."""
    return ray.get(registry().all.remote())


def shutdown() -> None:
    """Take the application and Serve down, and the registry and the shared feeds with them (the cluster
    stays)."""
    from server.ray_shares import SHARES
    try:
        serve.shutdown()
    finally:
        for name in (REGISTRY, SHARES):
            try:
                ray.kill(ray.get_actor(name, namespace=NAMESPACE))
            except ValueError:
                pass


def run_cli(settings: ServerSettings, opts: RayOptions) -> int:
    """`simulserve serve --ray`: deploy, print where, and keep the driver (and a local cluster) up until
    Ctrl-C or SIGTERM, then take the application down (and a local cluster with it)."""
    print(f"simulserve: deploying {', '.join(settings.models) or 'every shipped model'} on Ray Serve "
          f"({'cluster ' + opts.address if opts.address else 'a local cluster'})", file=sys.stderr, flush=True)
    deploy(settings, opts, host=settings.transport.host, port=settings.transport.port)
    print(f"simulserve: {len(replicas())} replica(s) up; "
          f"streams on ws://{settings.transport.host}:{settings.transport.port}/v1/stream, "
          f"replicas at http://{settings.transport.host}:{settings.transport.port}/v1/replicas",
          file=sys.stderr, flush=True)
    # Ctrl-C, or SIGTERM (a container stopped); also when the shell started us with SIGINT ignored
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        stop.wait()
    finally:
        print("simulserve: taking the application down", file=sys.stderr, flush=True)
        shutdown()
        ray.shutdown()
    return 0
