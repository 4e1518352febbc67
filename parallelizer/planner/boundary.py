"""Pricing and choice of pipeline-boundary compression (`core.boundary_codec`), and its record in the plan.

Option (`PlanConfig.boundary_compression`): "none" (default: lossy numerics are opt-in), "int8" / "lowrank"
(forced on every stage boundary), "auto" (the search picks per boundary among none and int8, and keeps the
compressed pipeline only when it lowers the estimated step time by at least `MIN_GAIN`; it never picks
lowrank, whose projection of an unconstrained model is lossy: `core.boundary_codec` docstring).

Price of one boundary (cut after block k) per microbatch, seconds, for codec c with wire ratio
rho_c = wire bytes / bytes of the values crossing (`core.boundary_codec.wire_bytes`, per value: only the values
`compressible` accepts shrink):
    forward  = p2p(rho_c * activation bytes) + codec_s        backward = p2p(rho_c * gradient bytes) + codec_s
where p2p is the search's transfer (`candidates._Context._p2p_s`: send_recv of 1/tp over "pp" + all-gather over
"tp"; only the send shrinks, the all-gather inside the node is priced uncompressed) and codec_s the encode +
decode on the device's roofline (`cost_model.hardware` conventions):
    int8:    traffic 2 (value bytes + wire bytes) (encode reads the value, writes the wire; decode the reverse)
             / (hbm_bytes_per_s * memory_efficiency)
    lowrank: 4 n r FLOPs (two (n/d, d) x (d, r) products) / (peak_flops_per_s[dtype] * matmul_efficiency)
With "auto" a boundary takes the codec with the lowest forward + backward seconds (ties: none).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cost_model.hardware import DeviceSpec

from ..core.boundary_codec import KINDS, compressible, wire_bytes
from ..tracer.graph import carries_grad

OPTIONS = ("none", "auto") + KINDS
MIN_GAIN = 0.05  # "auto" keeps compression only for >= 5% lower estimated step time (a lossy codec must pay)


def codecs_of(option: str) -> tuple[str, ...]:
    """The codec kinds the search may use under `option` (() for "none"). Raises ValueError for another."""
    if option not in OPTIONS:
        raise ValueError(f"boundary_compression={option!r}: use one of {OPTIONS}")
    return {"none": (), "auto": ("int8",)}.get(option, (option,))


@dataclass(frozen=True, slots=True)
class CodecPrice:
    """One codec on every cut k = 0..L at the trace batch: wire / raw bytes forward and backward, and the
    encode + decode seconds per direction (all linear in the microbatch: scale like the bytes)."""

    kind: str
    fwd_ratio: tuple[float, ...]
    bwd_ratio: tuple[float, ...]
    codec_s: tuple[float, ...]


def price_codecs(traced, cut_values: tuple[tuple[str, ...], ...], kinds: tuple[str, ...], rank: int,
                 device: DeviceSpec) -> dict[str, CodecPrice]:
    """`CodecPrice` per kind for the values crossing each cut (`segments.Segments.cut_values`), priced at
    their global shapes (the ratio is the same for tp shards unless a shard's last dim falls to <= rank).
    Only values that carry a gradient are compressed (`runtime.pipeline.boundary_codecs`, the same rule)."""
    from .segments import depends_on_parameters
    learned = depends_on_parameters(traced) if kinds else set()
    out = {}
    for kind in kinds:
        fr, br, cs = [], [], []
        for names in cut_values:
            raw_f = wire_f = raw_b = wire_b = 0
            seconds = 0.0
            for n in names:
                meta = traced.node(n).outputs[0]
                shape, dtype = tuple(meta.shape), meta.dtype
                on = n in learned and compressible(shape, dtype, kind, rank)
                raw, wire = wire_bytes(shape, dtype, None, rank), wire_bytes(shape, dtype, kind if on else None, rank)
                raw_f, wire_f = raw_f + raw, wire_f + wire
                if n in learned and carries_grad(dtype):  # what carries a gradient back (as segments counts)
                    raw_b, wire_b = raw_b + raw, wire_b + wire
                if on:
                    seconds += codec_seconds(kind, shape, dtype, rank, device)
            fr.append(wire_f / raw_f if raw_f else 1.0)
            br.append(wire_b / raw_b if raw_b else 1.0)
            cs.append(seconds)
        out[kind] = CodecPrice(kind, tuple(fr), tuple(br), tuple(cs))
    return out


def codec_seconds(kind: str, shape: tuple[int, ...], dtype: torch.dtype, rank: int, device: DeviceSpec) -> float:
    """Encode + decode seconds of one value (module docstring's roofline), one direction."""
    if kind == "int8":
        traffic = 2 * (wire_bytes(shape, dtype, None, rank) + wire_bytes(shape, dtype, kind, rank))
        return traffic / (device.hbm_bytes_per_s * device.memory_efficiency)
    flops = 4 * math.prod(shape) * rank
    peak = device.peak_flops_per_s.get(dtype, device.peak_flops_per_s[torch.float32])
    return flops / (peak * device.matmul_efficiency)


@dataclass(frozen=True, slots=True)
class BoundaryChoice:
    """What one stage boundary (stage `boundary` -> `boundary` + 1) sends: codec ("none", "int8", "lowrank"),
    its fidelity (`bits` 8 for int8, `rank` r for lowrank, else None), wire / raw bytes, and seconds per
    microbatch (forward + backward transfer and codec) with it and without it."""

    boundary: int
    codec: str
    bits: int | None
    rank: int | None
    wire_ratio: float
    p2p_s: float
    uncompressed_p2p_s: float

    def __post_init__(self) -> None:  # stored as written (10 significant digits): a loaded plan compares equal
        for f in ("wire_ratio", "p2p_s", "uncompressed_p2p_s"):
            object.__setattr__(self, f, sig10(getattr(self, f)))

    @property
    def speedup(self) -> float:
        return self.uncompressed_p2p_s / self.p2p_s if self.p2p_s > 0 else 1.0

    def to_dict(self) -> dict:
        return {"boundary": self.boundary, "codec": self.codec, "bits": self.bits, "rank": self.rank,
                "wire_ratio": self.wire_ratio, "p2p_s": self.p2p_s, "uncompressed_p2p_s": self.uncompressed_p2p_s}


@dataclass(frozen=True, slots=True)
class BoundaryCompression:
    """`Plan.pipeline.compression`: the option, the estimated step with the chosen codecs (`step_s`) and with
    none on the same stages (`uncompressed_step_s`), and one `BoundaryChoice` per stage boundary.
    JSON: {"option", "step_s", "uncompressed_step_s", "rank", "boundaries": [BoundaryChoice.to_dict()]}."""

    option: str
    step_s: float
    uncompressed_step_s: float
    rank: int
    boundaries: tuple[BoundaryChoice, ...]

    def __post_init__(self) -> None:  # as BoundaryChoice
        for f in ("step_s", "uncompressed_step_s"):
            object.__setattr__(self, f, sig10(getattr(self, f)))

    @property
    def speedup(self) -> float:
        return self.uncompressed_step_s / self.step_s if self.step_s > 0 else 1.0

    @property
    def kinds(self) -> tuple[str | None, ...]:
        """Per boundary the codec the runtime applies (None: uncompressed): `runtime.pipeline.build(boundary=)`."""
        return tuple(None if b.codec == "none" else b.codec for b in self.boundaries)

    def to_dict(self) -> dict:
        return {"option": self.option, "step_s": self.step_s, "uncompressed_step_s": self.uncompressed_step_s,
                "rank": self.rank,
                "boundaries": [b.to_dict() for b in self.boundaries]}

    @classmethod
    def from_dict(cls, d: dict) -> "BoundaryCompression":
        return cls(d["option"], d["step_s"], d["uncompressed_step_s"], d["rank"],
                   tuple(BoundaryChoice(**b) for b in d["boundaries"]))

    def _title(self) -> str:
        return (f"Pipeline boundary compression ({self.option}): estimated step {self.step_s * 1e3:.3f} ms vs "
                f"{self.uncompressed_step_s * 1e3:.3f} ms uncompressed on the same stages ({self.speedup:.2f}x)")

    def table(self) -> tuple[str, list[str], list[list[str]]]:
        """(title, header, rows) for `show`: per boundary codec, fidelity, wire share of the bytes, and its
        transfer milliseconds per microbatch (forward + backward) with and without the codec."""
        rows = [[f"{b.boundary} -> {b.boundary + 1}", b.codec,
                 {"int8": f"{b.bits}-bit", "lowrank": f"rank {b.rank}"}.get(b.codec, "full precision"),
                 f"{b.wire_ratio:.3f}", f"{b.p2p_s * 1e3:.3f}", f"{b.uncompressed_p2p_s * 1e3:.3f}",
                 f"{b.speedup:.2f}x"] for b in self.boundaries]
        return self._title(), ["stages", "codec", "fidelity", "wire/raw", "ms", "ms uncompressed", "speedup"], rows

    def lines(self) -> list[str]:
        """`table` as text lines (for `Plan.summary` and `PipelinePlan.summary`)."""
        _, header, rows = self.table()
        return [self._title()] + ["  " + ", ".join(f"{h} {c}" for h, c in zip(header, r)) for r in rows]


def build_options(compression: "BoundaryCompression | dict | None") -> dict:
    """The keyword arguments `runtime.pipeline.build` takes for a plan's boundary compression (a
    `BoundaryCompression`, its JSON dict, or None: {})."""
    if compression is None:
        return {}
    if isinstance(compression, dict):
        compression = BoundaryCompression.from_dict(compression)
    return {"boundary": compression.kinds, "boundary_rank": compression.rank}


def choose(kinds: tuple[str, ...], forced: bool, prices: dict[str, CodecPrice], p2p, fwd_bytes, bwd_bytes,
           scale: float) -> tuple[tuple[str, ...], tuple[float, ...], tuple[float, ...]]:
    """Per cut k the codec and its forward / backward seconds per microbatch (module docstring).

    Args:
        kinds: allowed codecs; forced: use kinds[0] on every cut instead of the cheapest (or none).
        p2p: `p2p(nbytes) -> seconds` of one transfer across the cut (already scaled bytes).
        fwd_bytes / bwd_bytes: raw bytes per cut at the trace batch; scale: microbatch / trace batch.
    """
    codecs, cut_f, cut_b = [], [], []
    for k, (fb, bb) in enumerate(zip(fwd_bytes, bwd_bytes)):
        options = [] if forced else [("none", p2p(fb * scale), p2p(bb * scale))]
        for kind in kinds:
            pr = prices[kind]
            extra = pr.codec_s[k] * scale
            options.append((kind, p2p(fb * scale * pr.fwd_ratio[k]) + extra,
                            p2p(bb * scale * pr.bwd_ratio[k]) + (extra if bb else 0.0)))
        best = min(options, key=lambda o: o[1] + o[2])  # first wins ties: none
        codecs.append(best[0])
        cut_f.append(best[1])
        cut_b.append(best[2])
    return tuple(codecs), tuple(cut_f), tuple(cut_b)


def sig10(x: float) -> float:
    """x at 10 significant digits, as `planner.plan._round` writes floats to JSON."""
    return float(f"{x:.10g}")
