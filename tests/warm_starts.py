"""The pinned SFT warm starts (tests/data/warm-starts; scripts/pin_warm_starts.py) as the tests' runs use them:
``train.sh`` trains from the pinned checkpoint instead of building the recipe's warm start, which a fresh
machine would otherwise build (about 8 minutes each) before its first training test."""

from pathlib import Path

PINNED = Path(__file__).resolve().parent / "data" / "warm-starts"


def pinned(recipe: str) -> Path:
    """The pinned warm start of ``recipe`` ("multiturn" or "learn")."""
    path = PINNED / recipe
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no pinned warm start {path}: python scripts/pin_warm_starts.py {recipe}")
    return path


def trains_from_pinned(recipe: str) -> list[str]:
    """The ``train.sh`` overrides of a run that trains from the pinned warm start of ``recipe``."""
    return [f"actor.path={pinned(recipe)}", "sft.warm_start=false"]
