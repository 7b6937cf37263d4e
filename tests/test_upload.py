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
