"""Server settings: command-line flags > SIMULSERVE_* environment variables > YAML file > defaults.

    simulserve serve gma=models/checkpoints/gma_delta1 --port 8000
    SIMULSERVE_MODELS="gma=/ckpt/gma,waitk=/ckpt/waitk" SIMULSERVE_API_KEYS=secret simulserve serve
    simulserve serve --config server.yaml      (or SIMULSERVE_CONFIG=server.yaml)

List and mapping settings accept JSON or the short forms `a,b` and `name=path,name=path`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, YamlConfigSettingsSource


class SettingsError(ValueError):
    pass


# Settings that were removed, and why: a file or environment that still sets one fails naming it.
REMOVED = {
    "tail_burst_ms": "removed: the tail burst measured worse than stepping tails with the others (CHANGELOG.md)",
    "continuations": "removed: extra steps per job measured worse than one step per job (CHANGELOG.md)",
}


# The settings in groups: what the code reads (`settings.limits.max_streams`), and how a YAML file may nest
# them (`limits: {max_streams: 100}`). Flags and SIMULSERVE_* variables keep the flat names.
@dataclass(frozen=True)
class ServingSettings:
    """What is served, and how its steps run."""
    models: dict[str, str]
    device: str
    dtype: str
    step: str
    no_repeat_ngram: int
    no_stutter: int | None
    early_eos: str
    boundary_model: str | None
    torch_threads: int | None
    warmup: bool
    memory_trim_s: float


@dataclass(frozen=True)
class BatchingSettings:
    batch_window_ms: float
    max_batch: int
    no_batching: list[str]
    overlap: str


@dataclass(frozen=True)
class LimitSettings:
    """What one client, one connection or the whole server may use (docs/hardening.md)."""
    max_streams: int
    max_message_bytes: int
    max_words_per_sentence: int
    max_backlog_words: int
    max_output_messages: int
    idle_timeout_s: float
    start_timeout_s: float
    max_connections_per_ip: int
    max_header_bytes: int
    max_headers: int
    request_head_timeout_s: float
    rate_limit: float
    rate_burst: int
    max_k: int
    max_delta: float
    max_viewers: int
    share_grace_s: float


@dataclass(frozen=True)
class HeadroomSettings:
    """Admission by measured headroom (server/admission.py)."""
    admission: bool
    delay_budget_ms: float
    admission_quiet_s: float
    admission_retry_max_s: float


@dataclass(frozen=True)
class AuthSettings:
    api_keys: list[str]
    allowed_origins: list[str]
    max_auth_failures_per_ip: int
    auth_failure_window_s: float


@dataclass(frozen=True)
class TransportSettings:
    host: str
    port: int
    forwarded_allow_ips: str | None
    ssl_certfile: str | None
    ssl_keyfile: str | None
    web_dir: str | None
    log_level: str
    workers: int
    engines: int
    mps: str
    ws_compression: bool
    share_peers: list[str]


GROUPS = {"serving": ServingSettings, "batching": BatchingSettings, "limits": LimitSettings,
          "headroom": HeadroomSettings, "auth": AuthSettings, "transport": TransportSettings}


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SIMULSERVE_", extra="forbid", validate_default=True)

    host: str = Field("127.0.0.1", description="address to bind (0.0.0.0 to serve the network)")
    port: int = Field(8000, ge=0, le=65535)
    models: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict, description="name -> checkpoint directory (or shipped model name); "
                                          "empty: every shipped model")
    device: str = Field("auto", description="auto, cpu, cuda, cuda:1...")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="inference precision: float32; bfloat16 (faster on CPUs with AVX512-BF16, "
                               "may change outputs); float16 (CUDA only)")
    step: str = Field(
        "auto", description="the step's form (models/step_form.py): auto (the fastest of default, int8, int8-gemv, "
                            "gemv and plain, timed at start-up on this machine and cached; models/step_choice.py; "
                            "on a CUDA GPU in float32: graphs-encoder); default (float32 packed); int8 (int8 "
                            "weights, CPU); int8-gemv (int8, a lone row quantised and multiplied in one FBGEMM call; "
                            "CPU); gemv (default, a lone row by the BLAS's matrix-vector product; CPU); graphs (the "
                            "decoder step as CUDA graphs captured at start-up); graphs-encoder (the encoder's chunk "
                            "step captured too); graphs-fused (graphs-encoder with both steps compiled by "
                            "inductor first); compiled (torch.compile with padded shapes, CUDA graphs on CUDA; "
                            "each new shape compiles once, which takes seconds to minutes); host, sync-free, static, "
                            "plain")
    no_repeat_ngram: int = Field(0, ge=0, le=16, description="never write a subword that repeats an N-gram of the "
                                                           "sentence's translation (0: off)")
    no_stutter: int | None = Field(None, ge=0, le=16, description="never write a subword that repeats the last "
                                   "M <= N subwords right after them (default 0: off)")
    early_eos: Literal["read", "write"] = Field("read", description="an EOS before the source has ended: read "
                                                                    "(wait for the next word) or write (the best "
                                                                    "other token)")
    boundary_model: str | None = Field(None, description="the sentence-boundary classifier of auto_segment "
                                                         "'boundary' (a `train-segmenter` directory; default: the "
                                                         "shipped German one)")
    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads (`serve` default: CPUs - 1)")
    workers: int = Field(0, ge=0, le=64, description="front-end processes (websockets, JSON, limits) beside one engine "
                                                     "process that steps the models (1: everything in one process; "
                                                     "0, the default: 4 on a CUDA GPU with 8 or more CPUs, else 1; "
                                                     "docs/server.md#several-processes---workers-n)")
    engines: int = Field(0, ge=0, le=16, description="engine processes, each with its own copy of the models and "
                                                     "its own stepping thread, on the same device; new streams "
                                                     "go to the least loaded (0, the default: 2 on a CPU with 2 "
                                                     "or more cores or a CUDA GPU with 8 or more CPUs, given 4 GiB "
                                                     "of memory or more, else 1; more than 1 runs "
                                                     "the front ends apart, as --workers; "
                                                     "docs/server.md#several-engine-processes---engines-n)")
    mps: Literal["auto", "on", "off"] = Field("auto", description="NVIDIA's MPS, so that engine processes sharing a "
                                              "GPU run their kernels at once instead of taking turns: auto starts "
                                              "a daemon of the server's own where 2 or more engine processes share "
                                              "a CUDA GPU and nvidia-cuda-mps-control is installed (a daemon "
                                              "running already is used as it is); on: the same, an error where "
                                              "it cannot; off: never "
                                              "(docs/server.md#mps-engine-processes-sharing-a-gpu)")
    # engine
    batch_window_ms: float = Field(2.0, ge=0, le=1000, description="after an idle spell, wait this long for "
                                                                   "more streams to batch with")
    max_batch: int = Field(256, ge=1, description="most streams in one batched step")
    no_batching: Annotated[list[str], NoDecode] = Field(default_factory=list,
                                                        description="models stepped one stream at a time")
    overlap: Literal["auto", "on", "off"] = Field("auto", description="launch a job's step before the job before "
                                                  "it ends, so that its host work runs while the device computes "
                                                  "(auto: on a CUDA device)")
    warmup: bool = Field(True, description="run one tiny sentence through each model before serving")
    memory_trim_s: float = Field(60.0, ge=0, description="return freed heap memory to the OS this often "
                                                         "(glibc malloc_trim; 0 = never)")
    # limits
    max_streams: int = Field(512, ge=1, description="concurrent websocket streams (then `server_full`): the hard "
                                                   "ceiling above admission by headroom")
    admission: bool = Field(True, description="admission by headroom: a stream beyond what a model can keep "
                                              "within delay_budget_ms gets `server_busy` with retry_after at "
                                              "`start` (off: only max_streams; the headroom is still reported)")
    delay_budget_ms: float = Field(100.0, gt=0, le=60000, description="the real-time budget: p99 added delay of "
                                                                      "every word that admission protects")
    admission_quiet_s: float = Field(10.0, gt=0, description="a stream without input for this long holds no "
                                                              "share of the headroom until it sends again")
    admission_retry_max_s: float = Field(30.0, ge=0.1, le=3600, description="the longest retry_after a refused "
                                                                             "client is told to wait")
    max_message_bytes: int = Field(16384, ge=64)
    max_words_per_sentence: int = Field(200, ge=1)
    max_backlog_words: int = Field(512, ge=1, description="source words received but not yet read, per stream")
    max_output_messages: int = Field(20000, ge=10, description="unsent server messages before `slow_consumer`")
    idle_timeout_s: float = Field(300.0, gt=0, description="seconds without a valid client message (junk "
                                                          "does not count)")
    start_timeout_s: float = Field(5.0, gt=0, description="seconds from the websocket upgrade to `start`")
    max_connections_per_ip: int = Field(64, ge=0, description="open websocket connections per client address "
                                                              "(0 = no limit)")
    max_auth_failures_per_ip: int = Field(20, ge=0, description="failed API-key checks per client address in "
                                                                "auth_failure_window_s before it is refused "
                                                                "(0 = no limit)")
    auth_failure_window_s: float = Field(60.0, gt=0)
    max_header_bytes: int = Field(32768, ge=1024, description="size of an HTTP request head (then 431)")
    max_headers: int = Field(100, ge=8, description="headers in an HTTP request (then 431)")
    request_head_timeout_s: float = Field(10.0, gt=0, description="time to send a whole HTTP request head "
                                                                  "(then the connection is closed)")
    rate_limit: float = Field(100.0, gt=0, description="messages per second per connection (token bucket)")
    rate_burst: int = Field(200, ge=1)
    max_k: int = Field(32, ge=1, description="largest wait-k lag a client may ask for")
    max_delta: float = Field(16.0, ge=0, description="largest GMA δ a client may ask for")
    max_viewers: int = Field(1000, ge=0, le=100000, description="viewers of shared captions per process serving "
                                                                "them, each an open HTTP response (0: no "
                                                                "sharing; `start`'s `share` is refused)")
    share_grace_s: float = Field(120.0, gt=0, le=86400, description="a shared stream's speaker gone without `end` "
                                                                    "may carry its feed on with the share key "
                                                                    "for this long")
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list,
                                                     description="if set, streams need one of these keys")
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["*"], description="browser origins allowed to connect (* = any)")
    # transport
    forwarded_allow_ips: str | None = Field(None, description="proxies whose X-Forwarded-For gives the client "
                                                              "address (comma list, * = any; default: "
                                                              "$FORWARDED_ALLOW_IPS or 127.0.0.1,::1)")
    ssl_certfile: str | None = Field(None, description="serve wss:// and https:// with this certificate")
    ssl_keyfile: str | None = None
    web_dir: str | None = Field(None, description="static caption page served at / (default clients/web)")
    log_level: str = "info"
    share_peers: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="the other replicas behind a load balancer, HOST:PORT each (a name "
                                          "that resolves to several addresses means each): a viewer of a shared "
                                          "feed that another replica holds is relayed from it")
    ws_compression: bool = Field(False, description="permessage-deflate on the websockets (off: a stream's messages "
                                                    "are a few dozen bytes, and deflating each took about an eighth "
                                                    "of the event loop's samples in a profile at 100 speakers)")

    @field_validator("models", mode="before")
    @classmethod
    def _parse_models(cls, v: Any):
        if isinstance(v, str):
            v = v.strip()
            if v.startswith("{"):
                return json.loads(v)
            out = {}
            for item in filter(None, (x.strip() for x in v.split(","))):
                name, sep, path = item.partition("=")
                if not sep or not name or not path:
                    raise ValueError(f"model {item!r}: expected NAME=PATH")
                out[name] = path
            return out
        return v

    @field_validator("no_batching", "api_keys", "allowed_origins", "share_peers", mode="before")
    @classmethod
    def _parse_list(cls, v: Any):
        if isinstance(v, str):
            v = v.strip()
            if v.startswith("["):
                return json.loads(v)
            return [x.strip() for x in v.split(",") if x.strip()]
        return v

    @field_validator("step")
    @classmethod
    def _known_form(cls, v: str):
        from models.step_form import step_form
        return step_form(v).name   # ValueError naming the forms

    @field_validator("share_peers")
    @classmethod
    def _host_and_port(cls, v: list[str]):
        for peer in v:
            host, _, port = peer.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"share peer {peer!r}: expected HOST:PORT")
        return v

    @field_validator("api_keys")
    @classmethod
    def _no_empty_key(cls, v: list[str]):
        if any(not k.strip() for k in v):
            raise ValueError("an API key is empty (an unset shell variable?): an empty key would let clients "
                             "without a key in; remove it or give a real key")
        return v

    @model_validator(mode="before")
    @classmethod
    def _flatten_groups(cls, data: Any):
        """A settings file may nest settings under their group (`limits: {max_streams: 100}`)."""
        if not isinstance(data, dict):
            return data
        # flat names first: a flag or SIMULSERVE_* variable (merged into the same dict) wins over a file's group
        out = {key: value for key, value in data.items() if key not in GROUPS}
        for key, value in data.items():
            group = GROUPS.get(key)
            if group is None:
                continue
            if not isinstance(value, dict):
                raise ValueError(f"{key}: a group of settings takes a mapping, got {value!r}")
            names = {f.name for f in fields(group)}
            for name, v in value.items():
                if name not in names:
                    raise ValueError(f"{key}.{name}: no such setting in {key} (it has {', '.join(sorted(names))})")
                out.setdefault(name, v)
        return out

    def group(self, name: str):
        """The settings of one group (GROUPS) as a frozen dataclass."""
        cls = GROUPS[name]
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})

    @property
    def serving(self) -> ServingSettings:
        return self.group("serving")

    @property
    def batching(self) -> BatchingSettings:
        return self.group("batching")

    @property
    def limits(self) -> LimitSettings:
        return self.group("limits")

    @property
    def headroom(self) -> HeadroomSettings:
        return self.group("headroom")

    @property
    def auth(self) -> AuthSettings:
        return self.group("auth")

    @property
    def transport(self) -> TransportSettings:
        return self.group("transport")

    def origin_allowed(self, origin: str | None) -> bool:
        """Non-browser clients send no Origin header and are always allowed."""
        return origin is None or "*" in self.allowed_origins or origin in self.allowed_origins


def load_settings(config_file: str | os.PathLike | None = None, **overrides) -> ServerSettings:
    """Settings from (highest first) `overrides` (the CLI), SIMULSERVE_* env, the YAML file, defaults.
    The YAML file is `config_file` or $SIMULSERVE_CONFIG."""
    config_file = config_file or os.environ.get("SIMULSERVE_CONFIG")
    if config_file and not Path(config_file).is_file():
        raise SettingsError(f"settings file not found: {config_file}")

    class _Settings(ServerSettings):
        @classmethod
        def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                       file_secret_settings):
            sources = [init_settings, env_settings]
            if config_file:
                sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
            return tuple(sources)

    # unknown SIMULSERVE_* variables are not read at all (other tools use the prefix too): look for the removed
    stale = [f"SIMULSERVE_{name.upper()} ({why})" for name, why in REMOVED.items()
             if any(k.upper() == f"SIMULSERVE_{name.upper()}" for k in os.environ)]
    if stale:
        raise SettingsError("invalid settings: unset " + "; ".join(stale))
    try:
        s = _Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:
        problems = [validation_line(err) for err in e.errors()]
        hints = [f"{name}: {why}" for name, why in REMOVED.items() if any(err["loc"][:1] == (name,)
                                                                         for err in e.errors())]
        raise SettingsError("invalid settings: " + "; ".join(problems) + "".join(f"\n{h}" for h in hints)) from None
    except ValueError as e:
        raise SettingsError(f"invalid settings: {e}") from None
    return s


def _flag(setting: str) -> str:
    """The `serve` flag of a setting: --idle-timeout for idle_timeout_s, --api-key for api_keys."""
    from server.cli import FLAGS, LIST_FLAGS   # (here: the cli imports this module)
    for flag, (name, _) in {**FLAGS, **LIST_FLAGS}.items():
        if name == setting:
            return flag
    return "--" + setting.replace("_", "-")


def validation_line(err: dict) -> str:
    """One pydantic error as a line a user reads: the setting (its flag), what is wrong, the value given
    (pydantic's own text names an internal class and a web page)."""
    loc = ".".join(str(x) for x in err.get("loc", ()))
    msg = err.get("msg", "invalid")
    if msg.startswith(("Value error, ", "Assertion failed, ")):
        msg = msg.split(", ", 1)[1]
    if not loc:
        return msg
    name = loc if "." in loc else f"{loc} ({_flag(loc)})"
    if err.get("type") == "extra_forbidden" or "input" not in err or isinstance(err["input"], dict):
        return f"{name}: {msg}"
    return f"{name}: {msg}, got {err['input']!r}"


def resolve_models(settings: ServerSettings) -> dict[str, Path]:
    """name -> checkpoint directory, checked (config.json readable) before anything loads."""
    from models.checkpoint import CheckpointError, read_config
    from models.shipped import resolve_checkpoint, shipped_checkpoints
    wanted = dict(settings.models) or {n: str(p) for n, p in shipped_checkpoints().items()}
    if not wanted:
        raise SettingsError("no model to serve: no checkpoint is shipped in models/checkpoints yet; name one "
                            "or more as NAME=PATH (e.g. `simulserve serve gma=runs/gma_delta1/checkpoint`), "
                            "with SIMULSERVE_MODELS or in the settings file")
    out = {}
    for name, where in wanted.items():
        try:
            path = resolve_checkpoint(where)
            read_config(path)
        except CheckpointError as e:
            raise SettingsError(f"model {name!r}: {e}") from None
        out[name] = path
    unknown = sorted(set(settings.no_batching) - set(out))
    if unknown:
        raise SettingsError(f"no_batching names unknown models: {unknown}")
    return out


def front_end_processes(settings: ServerSettings, device_type: str | None = None,
                        cpus: int | None = None) -> int:
    """How many front-end processes `serve` runs: the setting, or for 0 (auto) 4 on a CUDA GPU with 8 or more
    CPUs and 1 elsewhere. On an H200 with 16 CPUs, --workers 4 doubled the 1,024-stream throughput of one
    process; on a 2-core CPU one process kept as many speakers (docs/server.md#several-processes---workers-n)."""
    if settings.transport.workers:
        return settings.transport.workers
    device_type = device_type or serving_device_type(settings)
    cpus = cpus or os.cpu_count() or 1
    return 4 if device_type == "cuda" and cpus >= 8 else 1


def serving_device_type(settings: ServerSettings) -> str:
    """cpu or cuda (...): where `serve`'s models will step, as the process layout's auto settings see it."""
    if settings.serving.device == "cpu":
        return "cpu"   # (no torch import in the parent process for that)
    from models.checkpoint import pick_device
    return pick_device(settings.serving.device).type


AUTO_ENGINES_MIN_MEMORY_GIB = 4   # two engine processes hold the models twice: a 4-model container 1.85 GB, not 0.88


def engine_processes(settings: ServerSettings, device_type: str | None = None, cpus: int | None = None,
                     memory_gib: float | None = None) -> int:
    """How many engine processes `serve` runs: the setting, or for 0 (auto) 2 on a CPU with 2 or more cores, or
    on a CUDA GPU with 8 or more CPUs, given 4 GiB of memory or more; 1 elsewhere. One engine's interpreter is
    the bound on both: on two 2-core CPUs (an AMD EPYC and an Intel Xeon) two engine processes wrote 1.7-2.0x
    the words of one flat out and kept as many speakers or more in real time; on an H200 with 16 CPUs they wrote
    about 2x the words (29,000-32,000 a second against 13,400-14,700) and kept 4,000 speakers in real time where
    one missed (docs/server.md#several-engine-processes---engines-n)."""
    if settings.transport.engines:
        return settings.transport.engines
    device_type = device_type or serving_device_type(settings)
    cpus = cpus or os.cpu_count() or 1
    if memory_gib is None:
        try:
            memory_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
        except (ValueError, OSError):
            memory_gib = 0.0
    if memory_gib < AUTO_ENGINES_MIN_MEMORY_GIB:
        return 1
    # a GPU's engine also needs CPUs beside the 4 front ends workers auto gives it there
    return 2 if (device_type == "cpu" and cpus >= 2) or (device_type == "cuda" and cpus >= 8) else 1


def engine_device(device: str, index: int, gpus: int) -> str:
    """The device engine process `index` of `--engines N` steps on: a bare `cuda` (or `auto` where CUDA is) on a
    machine with several GPUs spreads the engine processes over them in turn (engine 1 on cuda:0, 2 on cuda:1,
    ...); a device named in full (`cuda:1`, `cpu`), or one GPU, is every engine's."""
    if gpus > 1 and device in ("cuda", "auto"):
        return f"cuda:{index % gpus}"
    return device
