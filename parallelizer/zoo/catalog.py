"""The catalog of outside models (`benchmarks/bench_models.py`'s table, tests and examples): one small model
per transformers family with its default config (`families`) and the hand-written kinds (`kinds`)."""
from __future__ import annotations

from .families import FAMILIES
from .kinds import KINDS

CATALOG = {**FAMILIES, **KINDS}


def build(name: str, seed: int = 0, device: str = "cpu") -> tuple:
    """`(model, args, kwargs)` of catalog model `name` (a module-level `model_fn` for `rehearse`).

    Raises:
        ValueError: an unknown name (lists the catalog).
    """
    if name not in CATALOG:
        raise ValueError(f"unknown catalog model {name!r}; choose one of {', '.join(CATALOG)}")
    return CATALOG[name](seed=seed, device=device)
