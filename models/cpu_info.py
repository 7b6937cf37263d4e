"""The CPU a figure was measured on: model, cores and the vector extensions that decide which step
form is fast (AVX2, AVX-512, VNNI, AMX), plus any instruction-set cap set in the environment.

Benchmarks print `cpu_summary()["line"]` beside every table, and `--step auto` keys its cached choice
on it: int8 without VNNI and float32 with AVX-512 are different machines for this project.
"""
from __future__ import annotations

import functools
import os
import platform

# environment variables that cap the instruction sets a library uses (set them to measure a weaker
# CPU class on a stronger machine; the figures then say so)
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS")


def _proc_cpuinfo() -> tuple[str, set[str]]:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def extensions(flags: set[str]) -> dict[str, bool]:
    """The vector extensions that matter here, from /proc/cpuinfo's flags."""
    return {"avx2": "avx2" in flags, "avx512": "avx512f" in flags,
            "vnni": bool({"avx512_vnni", "avx_vnni"} & flags), "amx": "amx_int8" in flags}


def describe(model: str, cores: int, ext: dict[str, bool], caps: dict[str, str]) -> str:
    names = {"avx2": "AVX2", "avx512": "AVX-512", "vnni": "VNNI", "amx": "AMX"}
    have = [names[k] for k in names if ext.get(k)]
    line = f"{model}, {cores} cores, {' + '.join(have) if have else 'no AVX2'}"
    if not ext.get("vnni") and ext.get("avx2"):
        line += " (no VNNI)"
    if caps:
        line += "; capped by " + ", ".join(f"{k}={v}" for k, v in caps.items())
    return line


@functools.lru_cache(maxsize=1)
def cpu_summary() -> dict:
    """{"model", "cores", "extensions", "caps", "torch_capability", "line"} of this machine."""
    model, flags = _proc_cpuinfo()
    ext = extensions(flags)
    caps = {k: os.environ[k] for k in ISA_CAPS if os.environ.get(k)}
    try:
        import torch
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - informative only
        capability = "unknown"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"model": model, "cores": cores, "extensions": ext, "caps": caps, "torch_capability": capability,
            "line": describe(model, cores, ext, caps)}
