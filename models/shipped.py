"""The checkpoints shipped inside the package (models/checkpoints/NAME)."""
from __future__ import annotations

from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent / "checkpoints"
DEFAULT_MODEL = "gma_delta1"


def shipped_checkpoints() -> dict[str, Path]:
    if not SHIPPED_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(SHIPPED_DIR.iterdir()) if (p / "config.json").is_file()}


def resolve_checkpoint(name_or_path: str | None) -> Path:
    """A checkpoint directory from a path or a shipped model's name (default: GMA δ=1)."""
    from models.checkpoint import CheckpointError
    name_or_path = name_or_path or DEFAULT_MODEL
    p = Path(name_or_path)
    if (p / "config.json").is_file() or p.exists():
        return p
    shipped = shipped_checkpoints()
    if name_or_path in shipped:
        return shipped[name_or_path]
    raise CheckpointError(f"no checkpoint directory {name_or_path!r} and no shipped model of that name "
                          f"(shipped: {', '.join(shipped) or 'none'})")
