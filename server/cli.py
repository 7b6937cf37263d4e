"""`simulserve serve`: load checkpoints once, serve /v1/stream, /health, /v1/models, /metrics.

    simulserve serve                                   # every shipped model
    simulserve serve gma=runs/gma/checkpoint waitk=runs/waitk/checkpoint --port 8000
    simulserve serve --config server.yaml              # flags > SIMULSERVE_* env > YAML > defaults
    simulserve serve --ray --replicas 2 --num-cpus 1   # the same app as Ray Serve replicas (docs/scaling.md)
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

# flag -> (settings field, argparse keywords)
FLAGS = {
    "--host": ("host", {}),
    "--port": ("port", {"type": int}),
    "--device": ("device", {"help": "auto (default), cpu, cuda, cuda:N"}),
    "--dtype": ("dtype", {"help": "float32 (default), bfloat16 (may change outputs), float16 (CUDA only)"}),
    "--step": ("step", {"help": "the step's form: auto (default: the fastest of default, int8, int8-gemv, gemv "
                                "and plain, timed at start-up here and cached; on a CUDA GPU in float32 "
                                "graphs-encoder), default (float32), int8 (int8 weights, CPU), int8-gemv (int8, a "
                                "lone row in one FBGEMM call; CPU), gemv (default, a lone row by BLAS gemv; CPU), "
                                "graphs (the decoder step as CUDA graphs captured at start-up), graphs-encoder (the "
                                "encoder's chunk step captured too), graphs-fused (graphs-encoder with both steps "
                                "compiled by inductor first), compiled (torch.compile, CUDA graphs on CUDA), host, "
                                "sync-free, static, plain (docs/benchmarks.md)"}),
    "--no-repeat-ngram": ("no_repeat_ngram", {"type": int, "help": "never write a subword that repeats an N-gram "
                                                                   "of the sentence's translation (default 0: off)"}),
    "--no-stutter": ("no_stutter", {"type": int, "help": "never write a subword that repeats the last M <= N "
                                                         "subwords right after them (default 0: off)"}),
    "--early-eos": ("early_eos", {"help": "an EOS before the source has ended: read (default: wait for the next "
                                          "word) or write (the best other token)"}),
    "--boundary-model": ("boundary_model", {"help": "the sentence-boundary classifier of auto_segment "
                                                    "'boundary' (default: the shipped German one)"}),
    "--torch-threads": ("torch_threads", {"type": int, "help": "torch intra-op threads (default: CPUs - 1)"}),
    # (no help here: the settings' own description, so that the auto rules are written once)
    "--workers": ("workers", {"type": int}),
    "--engines": ("engines", {"type": int}),
    "--mps": ("mps", {"choices": ["auto", "on", "off"]}),
    "--batch-window-ms": ("batch_window_ms", {"type": float, "help": "after an idle spell, wait this long for "
                                                                     "more streams to batch (default 2)"}),
    "--max-batch": ("max_batch", {"type": int, "help": "most streams per batched step (default 256)"}),
    "--overlap": ("overlap", {"choices": ["auto", "on", "off"], "help": "launch a job's step before the job "
                                                                      "before it ends, its host work overlapping "
                                                                      "the device's (default auto: on CUDA)"}),
    "--max-streams": ("max_streams", {"type": int, "help": "concurrent streams, the hard ceiling (default 512)"}),
    "--delay-budget-ms": ("delay_budget_ms", {"type": float, "help": "admission by headroom keeps the p99 added "
                                                                     "delay of every word within this (default "
                                                                     "100)"}),
    "--admission-quiet-s": ("admission_quiet_s", {"type": float, "help": "a stream without input this long holds "
                                                                         "no share of the headroom (default 10)"}),
    "--admission-retry-max-s": ("admission_retry_max_s", {"type": float, "help": "the longest retry_after a "
                                                                                 "refused client is told to wait "
                                                                                 "(default 30)"}),
    "--max-viewers": ("max_viewers", {"type": int, "help": "viewers of shared captions per serving process "
                                                           "(default 1000; 0: no sharing)"}),
    "--share-grace-s": ("share_grace_s", {"type": float, "help": "how long a shared stream's speaker gone "
                                                                 "without `end` may carry the feed on (default "
                                                                 "120)"}),
    "--max-message-bytes": ("max_message_bytes", {"type": int}),
    "--max-words-per-sentence": ("max_words_per_sentence", {"type": int}),
    "--max-backlog-words": ("max_backlog_words", {"type": int}),
    "--idle-timeout": ("idle_timeout_s", {"type": float, "help": "seconds without a valid client message "
                                                                 "(default 300)"}),
    "--start-timeout": ("start_timeout_s", {"type": float, "help": "seconds from connecting to `start` "
                                                                   "(default 5)"}),
    "--max-connections-per-ip": ("max_connections_per_ip", {"type": int, "help": "open websocket connections "
                                                                                 "per client address (default "
                                                                                 "64; 0 = no limit)"}),
    "--max-auth-failures-per-ip": ("max_auth_failures_per_ip", {"type": int, "help": "failed key checks per "
                                                                                     "address per minute before "
                                                                                     "it is refused (default 20)"}),
    "--max-header-bytes": ("max_header_bytes", {"type": int, "help": "HTTP request head size (default 32768)"}),
    "--max-headers": ("max_headers", {"type": int, "help": "HTTP headers per request (default 100)"}),
    "--request-head-timeout": ("request_head_timeout_s", {"type": float, "help": "seconds to send an HTTP "
                                                                                 "request head (default 10)"}),
    "--max-output-messages": ("max_output_messages", {"type": int, "help": "unsent messages to one client "
                                                                           "before `slow_consumer` (default "
                                                                           "20000)"}),
    "--memory-trim-s": ("memory_trim_s", {"type": float, "help": "return freed memory (heap, idle cache slots) "
                                                                 "this often (default 60; 0 = never)"}),
    "--rate-limit": ("rate_limit", {"type": float, "help": "messages per second per connection"}),
    "--rate-burst": ("rate_burst", {"type": int}),
    "--max-k": ("max_k", {"type": int}),
    "--max-delta": ("max_delta", {"type": float}),
    "--forwarded-allow-ips": ("forwarded_allow_ips", {"help": "proxies trusted for X-Forwarded-For (the "
                                                              "client address of the per-address limits)"}),
    "--ssl-certfile": ("ssl_certfile", {"help": "serve wss:// with this certificate (and --ssl-keyfile)"}),
    "--ssl-keyfile": ("ssl_keyfile", {}),
    "--web-dir": ("web_dir", {}),
    "--log-level": ("log_level", {}),
}
LIST_FLAGS = {
    "--api-key": ("api_keys", "require this key (repeat for several; an empty key is refused); clients send "
                              "`Authorization: Bearer KEY`, the subprotocol simulserve.key.BASE64URL(KEY) "
                              "or ?token=KEY"),
    "--allowed-origin": ("allowed_origins", "browser origin allowed to connect (repeat; default any)"),
    "--no-batching": ("no_batching", "step this model one stream at a time (repeat; for benchmarks)"),
    "--share-peer": ("share_peers", "another replica behind the same load balancer, HOST:PORT (repeat; a name "
                                    "that resolves to several addresses means each): viewers of its shared "
                                    "captions that reach this one are relayed from it"),
}

# flag -> (server.ray_serve.RayOptions field, argparse keywords)
RAY_FLAGS = {
    "--address": ("address", {"help": "a running Ray cluster (HOST:PORT or auto; default: start a local "
                                      "one)"}),
    "--replicas": ("replicas", {"type": int, "help": "fixed number of replicas (default 1)"}),
    "--min-replicas": ("min_replicas", {"type": int, "help": "autoscaling: fewest replicas (default 1)"}),
    "--max-replicas": ("max_replicas", {"type": int, "help": "autoscaling on open streams: most replicas"}),
    "--target-streams": ("target_streams", {"type": float, "help": "autoscaling: open streams per replica to "
                                                                    "aim for (default 32)"}),
    "--upscale-delay-s": ("upscale_delay_s", {"type": float, "help": "autoscaling: seconds more replicas must be "
                                                                     "wanted before they start (default 30)"}),
    "--downscale-delay-s": ("downscale_delay_s", {"type": float, "help": "autoscaling: seconds fewer must be "
                                                                         "wanted before one is taken out "
                                                                         "(default 600)"}),
    "--num-cpus": ("num_cpus", {"type": float, "help": "CPUs per replica (may be fractional; default 1)"}),
    "--num-gpus": ("num_gpus", {"type": float, "help": "GPUs per replica (1: one replica per GPU; default 0)"}),
    "--monitor-port": ("monitor_port", {"type": int, "help": "each replica's own /health and /metrics port "
                                                             "(default 0: any free port; /v1/replicas lists "
                                                             "them)"}),
    "--proxy-location": ("proxy_location", {"help": "HeadOnly (default) or EveryNode: where Ray runs its "
                                                    "HTTP proxy"}),
    "--graceful-shutdown-s": ("graceful_shutdown_s", {"type": float, "help": "a replica taken out waits this "
                                                                             "long for its streams (default 20)"}),
}


def ray_options_from_args(args):
    from server.ray_serve import RayOptions
    opts = RayOptions(**{field: v for flag, (field, _) in RAY_FLAGS.items()
                         if (v := getattr(args, flag[2:].replace("-", "_"))) is not None})
    opts.check()
    return opts


def register(sub) -> None:
    p = sub.add_parser(
        "serve", help="run the websocket streaming server (and the caption page at /)",
        description="Load checkpoints once and serve live streams on /v1/stream (also /health, /v1/models, "
                    "/v1/protocol, /metrics and the caption page at /).",
        epilog="examples:\n"
               "  simulserve serve                                  # every shipped model on 127.0.0.1:8000\n"
               "  simulserve serve gma=gma_delta1 waitk=waitk --host 0.0.0.0 --api-key KEY\n"
               "  simulserve serve mine=runs/gma_delta1/checkpoint --config server.yaml\n"
               "  simulserve serve gma=gma_delta1 --ray --replicas 2 --num-cpus 1   # Ray Serve (docs/scaling.md)\n"
               "settings: flags > SIMULSERVE_* environment > YAML (--config) > defaults",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", metavar="NAME=PATH",
                   help="checkpoints to serve (a directory or a shipped model name; NAME= may be left out)")
    p.add_argument("--config", help="YAML settings file (also $SIMULSERVE_CONFIG)")
    from server.settings import ServerSettings
    for flag, (field, kw) in FLAGS.items():
        kw = {"help": ServerSettings.model_fields[field].description, **kw}
        p.add_argument(flag, default=None, **kw)
    for flag, (_, help_) in LIST_FLAGS.items():
        p.add_argument(flag, action="append", default=None, help=help_)
    p.add_argument("--ws-compression", action="store_true", default=None,
                   help="permessage-deflate on the websockets (default off: messages are tiny)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up sentence per model")
    p.add_argument("--no-admission", action="store_true", help="admit every stream up to --max-streams (the "
                                                               "headroom is still reported; default: refuse a "
                                                               "stream beyond it with server_busy)")
    r = p.add_argument_group("Ray Serve (--ray; needs the [ray] extra; docs/scaling.md)")
    r.add_argument("--ray", action="store_true", help="serve as a Ray Serve deployment: replicas of this app "
                                                      "behind Ray's proxy on --host:--port")
    for flag, (_, kw) in RAY_FLAGS.items():
        r.add_argument(flag, default=None, **kw)
    p.set_defaults(func=run)


def parse_model_args(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:  # a bare path or shipped name: named after its directory
            name, path = Path(item.rstrip("/")).name, item
        if not name or not path:
            raise ValueError(f"{item!r}: expected NAME=PATH")
        out[name] = path
    return out


def settings_from_args(args):
    from server.settings import load_settings
    overrides = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _) in FLAGS.items()}
    overrides.update({field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _) in LIST_FLAGS.items()})
    if args.models:
        overrides["models"] = parse_model_args(args.models)
    if args.no_warmup:
        overrides["warmup"] = False
    if args.no_admission:
        overrides["admission"] = False
    if args.ws_compression:
        overrides["ws_compression"] = True
    return load_settings(args.config, **overrides)


def run(args) -> int:
    from server.mps import MpsError
    from server.settings import SettingsError
    ray_given = [f for f in RAY_FLAGS if getattr(args, f[2:].replace("-", "_")) is not None]
    if ray_given and not args.ray:
        print(f"simulserve serve: {', '.join(ray_given)} need --ray", file=sys.stderr)
        return 2
    if args.ray:
        return run_ray(args)
    try:
        settings = settings_from_args(args)   # bad settings are reported before the slow imports
        from server.settings import engine_processes, front_end_processes, serving_device_type
        device = serving_device_type(settings)   # (once: for cuda or auto it asks torch)
        settings.workers = front_end_processes(settings, device)   # 0: chosen by the device (settings.py)
        engines_auto = not settings.transport.engines
        settings.engines = engine_processes(settings, device)
        mps = mps_plan(settings, device)
        if apart(settings):   # engine processes and N front ends (server/workers.py)
            from server.settings import resolve_models
            served = list(resolve_models(settings))   # a bad checkpoint is reported here, once
        else:
            from server.app import create_app
            from server.guard import uvicorn_config
            app = create_app(settings)
            served = list(app.state.server.checkpoints)
    except (SettingsError, ValueError, MpsError) as e:
        print(f"simulserve serve: {e}", file=sys.stderr)
        return 2
    if settings.serving.torch_threads is None:  # leave a core to the event loop (websockets, JSON), share the rest
        settings.torch_threads = max(1, ((os.cpu_count() or 2) - 1) // settings.transport.engines)
    if apart(settings):
        scheme = "wss" if settings.transport.ssl_certfile else "ws"
        engines, fronts = settings.transport.engines, settings.transport.workers
        # (auto's two engine processes hold the models twice: say how to get one)
        where = "a CUDA GPU" if device == "cuda" else "a multi-core CPU"
        why = f"; engines auto on {where}: --engines 1 runs one process" if engines_auto and engines > 1 else ""
        if device == "cuda" and engines > 1:
            why += f"; MPS: {mps.reason}"
        print(f"simulserve: serving {', '.join(served)} on "
              f"{scheme}://{settings.transport.host}:{settings.transport.port}/v1/stream "
              f"({fronts} front-end process{'es' * (fronts > 1)}, {engines} engine process{'es' * (engines > 1)}"
              f"{why})",
              file=sys.stderr, flush=True)
        from server.workers import serve_workers
        return serve_workers(settings, mps)
    logging.basicConfig(level=settings.transport.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    scheme = "wss" if settings.transport.ssl_certfile else "ws"
    print(f"simulserve: serving {', '.join(served)} on "
          f"{scheme}://{settings.transport.host}:{settings.transport.port}/v1/stream", file=sys.stderr, flush=True)
    import uvicorn
    uvicorn.Server(uvicorn_config(app, settings, host=settings.transport.host, port=settings.transport.port,
                                  log_level=settings.transport.log_level.lower(),
                                  ssl_certfile=settings.transport.ssl_certfile,
                                  ssl_keyfile=settings.transport.ssl_keyfile, access_log=False)).run()
    return 0


def mps_plan(settings, device: str):
    """What serve does about NVIDIA's MPS (server/mps.py), given the GPUs the engine processes land on (the rule
    that spreads them: server/settings.py engine_device)."""
    from server.mps import plan
    from server.settings import engine_device
    gpus = 1
    if device == "cuda":
        import torch
        count = torch.cuda.device_count()
        gpus = len({engine_device(settings.serving.device, i, count) for i in range(settings.transport.engines)})
    return plan(settings.transport.mps, device, settings.transport.engines, gpus)


def apart(settings) -> bool:
    """Whether `serve` runs as processes (server/workers.py): several front ends or several engines."""
    return settings.transport.workers > 1 or settings.transport.engines > 1


def run_ray(args) -> int:
    from server.settings import SettingsError
    try:
        settings = settings_from_args(args)
        from server.settings import resolve_models
        resolve_models(settings)           # a bad checkpoint is reported here, not by every replica
        if settings.transport.engines > 1:
            raise SettingsError("--engines runs engine processes beside front ends in one server; behind Ray "
                                "Serve each replica is one process: scale with --replicas")
    except (SettingsError, ValueError) as e:
        print(f"simulserve serve: {e}", file=sys.stderr)
        return 2
    try:
        import ray  # noqa: F401
    except ImportError:
        print("simulserve serve --ray: Ray is not installed; pip install 'simulserve[ray]'", file=sys.stderr)
        return 2
    try:
        opts = ray_options_from_args(args)
    except ValueError as e:
        print(f"simulserve serve: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.transport.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from server.ray_serve import run_cli
    return run_cli(settings, opts)
