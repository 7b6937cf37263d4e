"""The forms of the streaming step: one named choice of how `StreamingDecoder` runs the model.

Every form writes what the plain computation writes (tests hold each one to it); they differ in
speed, in the devices they run on, and, for `int8`, in the weights' precision. A form fixes three
things at once, so that no combination of switches can be asked for that nobody has tested:

- `linears`: what runs the linear layers
    `plain`  F.linear and the explicit attention: the baseline `bench step` measures against;
    `packed` weights reordered once for oneDNN, fused projections (CPU; elsewhere the model's own);
    `gemv`   `packed`, but a lone row multiplied by the weight in (in, out) row order (the BLAS's matrix-vector
             path; CPU, float32): faster than oneDNN's packing for one row on some AVX2-only CPUs;
    `int8`   int8 weights and per-row int8 activations for attention and feed-forward layers,
             packed fp32 for the rest (CPU, float32 only; models/int8_linear.py);
    `int8-gemv` `int8`, but a lone row quantised and multiplied in one FBGEMM call (Int8GemvLinear), and the
             float linears `gemv`'s: faster alone where int8's row scaling costs more than its product;
    `fused`  the model's own linears, each input's projections fused into one product (a GPU's copy of
             `packed`): what torch.compile traces for graphs-fused;
    `model`  the model's own modules (what torch.compile traces for `compiled`);
- `sync_free`: the step never waits for the device (no early exit when every row READs, no boolean
  masks): one copy up and one copy back per step. None = per device (yes on a GPU, no on the CPU,
  where those shortcuts cost nothing and save work);
- `static_shapes` (batches and cache lengths padded to powers of two) and `compiled`
  (torch.compile of the decoder step; CUDA graphs on CUDA), which needs static shapes;
- `graphs`: static shapes, and the decoder step captured as CUDA graphs once, at start-up, for every padded
  batch size and cache length (`StreamingDecoder.capture_graphs`; models/cuda_graphs.py); on the CPU the
  same fixed shapes run eagerly. `graphs-encoder` captures the causal encoder's chunk step too;
  `graphs-fused` compiles the decoder step, the settling of its decisions and the encoder's chunk step with
  inductor (dynamic shapes, its default mode: fused kernels, none of its own CUDA graphs) and captures those, so
  that a graph holds fewer, larger kernels.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

from models.errors import UserError


class StepFormError(UserError):
    pass


@dataclass(frozen=True)
class StepForm:
    name: str
    linears: str
    sync_free: bool | None = None
    static_shapes: bool = False
    compiled: bool = False
    graphs: bool = False      # the decoder step as CUDA graphs captured at start-up (models/cuda_graphs.py)
    graph_encoder: bool = False   # graphs: the causal encoder's chunk step captured too
    summary: str = ""

    def resolve(self, device: torch.device, dtype: torch.dtype) -> "StepForm":
        """This form for a model on `device` in `dtype`: sync_free decided, and a clear error
        where the form cannot run there."""
        from models.int8_linear import int8_available, lone_rows_available
        from models.packed_linear import packing_available
        device = torch.device(device)
        if self.linears == "auto":
            raise StepFormError("step form 'auto' is chosen by measurement when a decoder is made "
                                "(models/step_choice.py), not resolved on its own")
        if self.linears == "int8" and not (int8_available(device, dtype) and packing_available(device, dtype)):
            raise StepFormError(f"step form 'int8' runs on the CPU with float32 weights only (here: {device.type}, "
                             f"{str(dtype).replace('torch.', '')}); on a GPU use --dtype bfloat16 instead")
        if self.linears == "int8-gemv" and not (lone_rows_available(device, dtype)
                                                and packing_available(device, dtype)):
            raise StepFormError(f"step form 'int8-gemv' runs on the CPU with float32 weights only (here: "
                                f"{device.type}, {str(dtype).replace('torch.', '')}); on a GPU use --dtype bfloat16 "
                                f"instead")
        if self.linears == "gemv" and not (packing_available(device, dtype) and dtype == torch.float32):
            raise StepFormError(f"step form 'gemv' runs on the CPU in float32 only (here: {device.type}, "
                                f"{str(dtype).replace('torch.', '')})")
        sync_free = device.type != "cpu" if self.sync_free is None else self.sync_free
        return replace(self, sync_free=sync_free or self.static_shapes)

    def describe(self) -> dict:
        """What /v1/models and the benchmarks print."""
        return asdict(self)


FORMS: dict[str, StepForm] = {f.name: f for f in (
    StepForm("default", "packed", summary="what serve, translate and evaluate run unless told otherwise"),
    StepForm("host", "packed", sync_free=False, summary="host shortcuts (early exit, masks): the CPU default"),
    StepForm("sync-free", "packed", sync_free=True, summary="the GPU form: one copy each way, no waits"),
    StepForm("static", "packed", sync_free=True, static_shapes=True,
             summary="sync-free with batches and cache lengths padded to powers of two"),
    StepForm("compiled", "model", sync_free=True, static_shapes=True, compiled=True,
             summary="static shapes + torch.compile of the decoder step (CUDA graphs on CUDA)"),
    StepForm("graphs", "packed", sync_free=True, static_shapes=True, graphs=True,
             summary="static shapes, the decoder step as CUDA graphs captured at start-up (on the CPU: run "
                     "eagerly); needs no_repeat_ngram and no_stutter off"),
    # the CUDA default (models/step_choice.py: gpu_form) since it passed the equivalence tests on an H200
    StepForm("graphs-encoder", "packed", sync_free=True, static_shapes=True, graphs=True, graph_encoder=True,
             summary="graphs, and the causal encoder's chunk step captured too (chunks of up to 64 subwords; "
                     "wider ones run eagerly)"),
    # (an experiment for the GPU's graphs: a graph of the eager decoder step is 236 small kernels, 134 of them
    # elementwise, with 0.25-0.3 us between two on an H200; docs/benchmarks.md, seventh measurement)
    StepForm("graphs-fused", "fused", sync_free=True, static_shapes=True, compiled=True, graphs=True,
             graph_encoder=True,
             summary="graphs-encoder, with the decoder step and the encoder's chunk step compiled by inductor (fused "
                     "kernels, no CUDA graphs of its own; projections fused) before they are captured: it compiles "
                     "while capturing (on the CPU: at its first steps)"),
    StepForm("int8", "int8", summary="int8 weights for attention and feed-forward layers (CPU, float32)"),
    StepForm("int8-gemv", "int8-gemv", summary="int8, but a lone row quantised and multiplied in one FBGEMM call, "
                                               "and float linears as gemv's (CPU, float32): faster alone"),
    StepForm("gemv", "gemv", summary="default, but a lone row multiplied by the weight in (in, out) order, the "
                                     "BLAS's matrix-vector path (CPU, float32): faster alone on some AVX2-only CPUs"),
    StepForm("plain", "plain", summary="no fast path: F.linear and the explicit attention (the baseline)"),
    # the server's default: the fastest form that passed the quality gate, timed where it runs
    # (models/step_choice.py; docs/benchmarks.md, "int8 weights")
    StepForm("auto", "auto", summary="the fastest of default, int8, int8-gemv, gemv and plain, timed at start-up on "
                                     "this machine (never slower than default): the server's default"),
)}


def step_form(form: "str | StepForm") -> StepForm:
    """The form named `form` (a StepForm passes through); StepFormError naming the choices."""
    if isinstance(form, StepForm):
        return form
    if form not in FORMS:
        raise StepFormError(f"unknown step form {form!r}: one of {', '.join(FORMS)}")
    return FORMS[form]


STEP_HELP = ("the step's form: default (float32); auto (the fastest of default, int8, int8-gemv, gemv, plain, "
             "timed here); int8 (int8 weights, CPU, float32); int8-gemv (int8 with a lone row in one FBGEMM call, "
             "CPU); gemv (default with a lone row by BLAS gemv, CPU); "
             "compiled (torch.compile, CUDA graphs on CUDA); "
             "graphs (CUDA graphs captured at start-up); graphs-encoder (the encoder's step captured too); "
             "graphs-fused (graphs-encoder with both steps compiled by inductor first); "
             "host, sync-free, static, plain (models/step_form.py, docs/benchmarks.md)")


def add_step_argument(parser) -> None:
    """The --step option of every command that translates (one help text, one validation)."""
    import argparse

    def form_name(value: str) -> str:
        try:
            return step_form(value).name
        except StepFormError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parser.add_argument("--step", default="default", type=form_name, help=STEP_HELP)
