"""What a CUDA capture of a compiled graph form compiles, found on any machine (recipes/compile_variants.py, tests).

A capture runs each graph body for every (batch, cache length[, chunk width]) before recording it
(models/cuda_graphs.py), so that is where inductor compiles. `warm_captured_shapes` runs the same bodies in the
same order, largest first, under the capture's rule: past dynamo's recompile limit an error, not a silent fall back
to eager.
"""
from __future__ import annotations

import time

import torch

# what graphs-fused compiles (StreamingDecoder): the model's two steps, and the decoder's settling of a trial
COMPILED = ("decode_step", "encode_chunk", "_settle")


def warm_captured_shapes(dec) -> dict:
    """Every captured body of `dec` (a compiled graph form, its graphs captured; off CUDA they run eagerly) run once in
    capture order. Returns {"variants": {method: variants dynamo compiled}, "seconds", "shapes": bodies run,
    "failed": None or where and why it stopped}."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    if dec.graphs is None or not dec.compiled:
        raise ValueError("warm_captured_shapes needs a compiled graph form (graphs-fused) with its graphs captured")
    t0, shapes, failed = time.perf_counter(), 0, None
    with torch.inference_mode(), torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for key, (_, static, body) in dec.graphs.entries.items():   # (capture order)
            try:
                body(*static)
            except (torch._dynamo.exc.FailOnRecompileLimitHit, torch._dynamo.exc.Unsupported) as e:
                # (the limit: reported with the counts so far)
                failed = f"{key}: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
                break
            shapes += 1
    variants = {name: len(_debug_get_cache_entry_list(getattr(dec.net if hasattr(dec.net, name) else dec, name)
                                                      .__func__.__code__)) for name in COMPILED}
    return {"variants": variants, "seconds": time.perf_counter() - t0, "shapes": shapes, "failed": failed}
