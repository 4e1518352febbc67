"""`MeshSpec`: a device-free abstract mesh (JAX's AbstractMesh idea) used for planning.

A mesh is a tuple of named axes with sizes, e.g. `MeshSpec(("dp", "tp"), (2, 4))` for 8 devices where
"dp" is the outer (slower) axis and "tp" the inner one (ranks are laid out row-major, the last axis
fastest, as in `torch.distributed.device_mesh.init_device_mesh`). Planning needs only names and sizes;
which links an axis crosses is the cost model's business (`cost_model.topology.MeshTopology`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True, slots=True)
class MeshSpec:
    """Named mesh axes and their sizes (last axis innermost).

    Attributes:
        axis_names: unique, non-empty names, e.g. ("dp", "tp").
        shape: one size >= 1 per axis, e.g. (2, 4).

    Raises:
        ValueError: naming what was declared and what is required (mismatched lengths, empty or duplicate
            names, sizes < 1).
    """

    axis_names: tuple[str, ...]
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        names, shape = tuple(self.axis_names), tuple(self.shape)
        object.__setattr__(self, "axis_names", names)
        object.__setattr__(self, "shape", shape)
        if not names or len(names) != len(shape):
            raise ConfigError(f"MeshSpec declared axis_names={names} and shape={shape}: "
                             "need the same number (>= 1) of names and sizes")
        if any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
            raise ConfigError(f"MeshSpec declared axis_names={names}: names must be unique non-empty strings")
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in shape):
            raise ConfigError(f"MeshSpec declared shape={shape}: every axis size must be an int >= 1")

    @property
    def ndim(self) -> int:
        """Number of mesh axes."""
        return len(self.shape)

    @property
    def world_size(self) -> int:
        """Number of devices, the product of the axis sizes."""
        return math.prod(self.shape)

    def size(self, axis: str | int) -> int:
        """Size of one axis given by name or index. Raises ValueError naming the mesh for an unknown axis."""
        return self.shape[self.index(axis)]

    def index(self, axis: str | int) -> int:
        """Index of an axis given by name (or an index, checked)."""
        if isinstance(axis, int) and 0 <= axis < self.ndim:
            return axis
        if axis in self.axis_names:
            return self.axis_names.index(axis)
        raise ConfigError(f"unknown mesh axis {axis!r} for mesh {self}; use one of {self.axis_names}")

    def __str__(self) -> str:
        return "(" + ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape)) + ")"

    def to_dict(self) -> dict:
        return {"axis_names": list(self.axis_names), "shape": list(self.shape)}

    @classmethod
    def of(cls, mesh: "MeshSpec | dict[str, int] | str") -> "MeshSpec":
        """A MeshSpec from a MeshSpec, a dict {"dp": 2, "tp": 4} or the CLI's string "dp=2,tp=4".

        Raises:
            ConfigError: another type, or a string that is not NAME=SIZE pairs with integer sizes (a ValueError).
        """
        if isinstance(mesh, MeshSpec):
            return mesh
        if isinstance(mesh, str):
            pairs = [item.partition("=") for item in mesh.split(",") if item.strip()]
            if not pairs or any(not sep or not name.strip() or not size.strip().isdigit() for name, sep, size in pairs):
                raise ConfigError(f"mesh {mesh!r}: use NAME=SIZE pairs with integer sizes, e.g. \"dp=4,tp=2\"")
            names = [name.strip() for name, _, _ in pairs]
            if len(set(names)) != len(names):
                raise ConfigError(f"mesh {mesh!r}: an axis is named twice")
            return cls(tuple(names), tuple(int(size) for _, _, size in pairs))
        if isinstance(mesh, dict):
            return cls(tuple(mesh), tuple(mesh.values()))
        raise ConfigError(f"mesh {mesh!r}: pass a dict such as {{'dp': 2, 'tp': 4}}, a string \"dp=2,tp=4\" or a MeshSpec")

    @classmethod
    def from_dict(cls, d: dict) -> "MeshSpec":
        return cls(tuple(d["axis_names"]), tuple(d["shape"]))
