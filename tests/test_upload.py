"""models/upload.py: the step's one host-to-device copy hands back every part as it was added, whatever the
mix of shapes (one-row tables, empty tables, plain lists), on the CPU and, where there is one, on CUDA."""
from __future__ import annotations

import random

import pytest
import torch

from models.upload import Upload

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_parts_come_back_as_added(device):
    rng = random.Random(3)
    for _ in range(200):
        up, want = Upload(), {}
        for i in range(rng.randint(1, 6)):
            rows, cols = rng.randint(0, 9), rng.randint(1, 5)
            if rng.random() < 0.3:   # a plain list: one dimension
                values = [rng.randint(-2**63, 2**63 - 1) for _ in range(rows)]
                up.add(f"p{i}", values, (rows,))
                want[f"p{i}"] = torch.tensor(values, dtype=torch.long).view(rows)
            else:
                values = [[rng.randint(-2**40, 2**40) for _ in range(cols)] for _ in range(rows)]
                up.add(f"p{i}", values, (rows, cols))
                want[f"p{i}"] = torch.tensor(values, dtype=torch.long).view(rows, cols)
        got = up.send(torch.device(device))
        assert list(got) == list(want)
        for name, t in want.items():
            assert got[name].shape == t.shape and got[name].device.type == device
            assert torch.equal(got[name].cpu(), t), name


def test_nothing_added_sends_nothing_and_a_wrong_shape_is_refused():
    assert Upload().send(torch.device("cpu")) == {}
    up = Upload()
    up.add("empty", [], (0, 2))
    assert up.send(torch.device("cpu"))["empty"].shape == (0, 2)
    with pytest.raises(ValueError, match="3 values for shape"):
        Upload().add("bad", [[1, 2, 3]], (2, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_placed_parts_land_padded_in_the_graph_inputs(device):
    """Upload.place: a captured graph's inputs written at their fixed places of the graphs' one input buffer,
    padded to the captured rows, sent with one copy (CUDA; the CPU's buffer is written in place) alongside the
    ordinary parts; what comes back is the buffer's own view for each place (what a graph was captured with).
    Steps sent back to back, none waited for, each keep their values (CUDA: a staging copy is not rewritten
    while its copy is queued)."""
    from models.graph_inputs import GraphInputs
    dev = torch.device(device)
    inputs = GraphInputs(dev, max_batch=8, fresh_columns=2, max_width=4)
    rng = random.Random(5)
    seen, want = [], []
    for _ in range(60):
        b, w = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4])
        up = Upload(inputs)
        slots = [rng.randint(0, 99) for _ in range(rng.randint(0, b))]
        changes = [[rng.randint(-2**40, 2**40) for _ in range(5)] for _ in range(rng.randint(0, b))]
        tokens = [[rng.randint(0, 50) for _ in range(w)] for _ in range(rng.randint(1, b))]
        at, enc = inputs.decoder(b), inputs.encoder(b, w)
        up.place("dec_slots", at[0], slots, (b,), 7)
        up.place("changes", at[1], changes, (b, 5), [7, 0, 1, 1, 1])
        up.place("enc_tokens", enc[0], tokens, (b, w), 3)
        up.add("other", [[1, 2], [3, 4]], (2, 2))
        got = up.send(dev)
        assert got["dec_slots"] is inputs.view(at[0], (b,)) and got["enc_tokens"] is inputs.view(enc[0], (b, w))
        assert got["other"].device.type == device
        seen.append({name: t.clone() for name, t in got.items()})   # (queued behind the copy on CUDA)
        want.append({"dec_slots": torch.tensor(slots + [7] * (b - len(slots))),
                     "changes": torch.tensor(changes + [[7, 0, 1, 1, 1]] * (b - len(changes)), dtype=torch.long
                                             ).view(b, 5),
                     "enc_tokens": torch.tensor(tokens + [[3] * w] * (b - len(tokens))),
                     "other": torch.tensor([[1, 2], [3, 4]])})
    for s, x in zip(seen, want):
        assert list(s) == ["dec_slots", "changes", "enc_tokens", "other"]
        for name in x:
            assert torch.equal(s[name].cpu(), x[name]), name
    assert inputs.copies == (60 if device == "cuda" else 0)
    with pytest.raises(ValueError, match="3 rows for shape"):
        Upload(inputs).place("too_many", 0, [1, 2, 3], (2,), 0)
    with pytest.raises(ValueError, match="overrun"):
        inputs.view(inputs.size - 2, (4,))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the decisions come back through pinned memory on CUDA")
def test_readback_returns_each_steps_decisions_through_reused_buffers():
    """Readback: the (B, 3) decisions copied to pinned host memory behind the kernels, for batches of several
    sizes in flight at once; a buffer given back serves the next step, and its views are reused (no slice a step)."""
    from models.graph_inputs import Readback
    rb, rng = Readback(), random.Random(6)
    views: dict[tuple, int] = {}   # (buffer, rows) -> the view a step got
    for _ in range(20):
        started = []
        for rows in rng.sample([1, 3, 8, 16, 64], 3):
            decided = torch.randint(0, 1000, (rows, 3), device="cuda")
            started.append((decided.cpu(), *rb.start(decided)))
        for want, host, item in started:
            item[1].synchronize()
            assert torch.equal(host, want)
            assert views.setdefault((id(item[0]), host.shape[0]), id(host)) == id(host)
            rb.give(item)
    assert len(rb._free) <= 9   # (reused: at most three in flight of each size, 8, 16 and 64 rows)
