"""The shipped models' recipes (recipes/gma_delta1.yaml, waitk.yaml, offline.yaml) are self-contained and
say what they train: no `base:` chain, a three-line header (what, the command, how long on which hardware),
and exactly the settings of the `base:` chain they were flattened from (recipes/everyday/, kept under the
git tag experiments-2026-11), read by the project's own loader both ways (CPU and the `gpu:` section)."""
from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from clients.cli import build_parser
from models.training.train import load_train_config

ROOT = Path(__file__).resolve().parents[1]
TAG = "experiments-2026-11"
COMMIT = "c2f56b3"   # the commit the tag names: a clone without tags still has it
# shipped name -> the last recipe of its `base:` chain at the tag
CHAINS = {"gma_delta1": "recipes/everyday/round17g/gma_delta1_ul3.yaml",
          "waitk": "recipes/everyday/gpu1/waitk.yaml",
          "offline": "recipes/everyday/round4/offline.yaml"}


@pytest.mark.parametrize("name", list(CHAINS))
def test_recipe_is_self_contained_with_a_three_line_header(name):
    path = ROOT / "recipes" / f"{name}.yaml"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert all(line.startswith("# ") for line in lines[:3]) and not lines[3].startswith("#"), \
        f"{path.name}: the header is three comment lines (what it trains, the command, how long on what)"
    command = lines[1][2:].split("  ")[0]
    assert command.startswith(f"simulserve train recipes/{name}.yaml"), lines[1]
    build_parser(command.split()[1:]).parse_args(command.split()[1:])   # the command parses
    assert "min" in lines[2] and ("CPU" in lines[2] or "GPU" in lines[2] or "H200" in lines[2]), lines[2]
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert "base" not in raw, f"{path.name} still inherits from another recipe"
    for cuda in (False, True):
        load_train_config(path, cuda_available=cuda)


@pytest.mark.parametrize("name", list(CHAINS))
def test_recipe_builds_the_shipped_architecture(name):
    """The recipe's model section is what the shipped checkpoint's config.json says it was trained with."""
    config = json.loads((ROOT / "models" / "checkpoints" / name / "config.json").read_text())
    recipe = load_train_config(ROOT / "recipes" / f"{name}.yaml", cuda_available=False)
    assert recipe.model == config["training"]["train_config"]["model"]
    assert {k: config["model"][k] for k in recipe.model} == recipe.model


def chain_at_tag(tmp_path: Path) -> Path:
    """recipes/ as it was at the tag, extracted into tmp_path (skips where git or the tag is missing)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    found = [ref for ref in (f"refs/tags/{TAG}", f"{COMMIT}^{{commit}}")
             if subprocess.run(["git", "rev-parse", "-q", "--verify", ref], cwd=ROOT,
                               capture_output=True).returncode == 0]
    if not found:
        pytest.skip(f"neither the tag {TAG} nor commit {COMMIT} is in this clone (a shallow clone)")
    archive = tmp_path / "recipes.tar"
    subprocess.run(["git", "archive", "-o", str(archive), found[0].removesuffix("^{commit}"), "recipes/everyday"],
                   cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path


@pytest.mark.parametrize("name", list(CHAINS))
def test_flattened_recipe_resolves_to_the_chains_settings(name, tmp_path):
    old = chain_at_tag(tmp_path) / CHAINS[name]
    new = ROOT / "recipes" / f"{name}.yaml"
    for cuda in (False, True):
        assert load_train_config(new, cuda_available=cuda) == load_train_config(old, cuda_available=cuda), \
            f"{new.name} differs from {CHAINS[name]} at {TAG} (cuda={cuda})"


def test_the_comparison_sees_a_changed_setting(tmp_path):
    """The check above fails when a flattened setting drifts (here the seed)."""
    old = chain_at_tag(tmp_path) / CHAINS["gma_delta1"]
    changed = tmp_path / "changed.yaml"
    changed.write_text((ROOT / "recipes" / "gma_delta1.yaml").read_text().replace("seed: 30", "seed: 31"))
    assert load_train_config(changed, cuda_available=False) != load_train_config(old, cuda_available=False)
