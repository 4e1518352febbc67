"""How much of the calibrated kernel rates a real training step achieves on this machine (calibration).

The calibrated device prices every op by a roofline over rates measured on isolated kernels (square matmuls,
the STREAM "add" on 64 MiB arrays, :mod:`cost_model.calibrate`). Inside a training step the same ops run
slower: measured here on one thread (2026-12-01, GPT-2 of 4 layers, hidden 256, batch 4 x 128, node by node
in the step vs each op alone on fresh inputs of its shapes): elementwise ops 1.25-1.5x (their inputs come
cold from the previous op instead of a warm cache), matmuls on transposed or permuted operands (attention)
1.8x, the cross-entropy 2.3x, views and reshapes that dispatch and sometimes copy, so the forward ran 56 ms
against 46 ms for its ops alone and 41 ms priced. None of these is a kernel rate the calibration can measure
in isolation.

So calibration measures it on a reference step: :func:`reference_model` (a small pre-LayerNorm transformer
language model in plain ``torch.nn``, written here, not one of the benchmark's models) is trained for one
forward + backward on one thread, and the same step is priced by :func:`cost_model.compute.op_cost` on the
calibrated device (its torch.export graph, node by node, forward and backward):

    step_efficiency = priced seconds / measured seconds          (median over interleaved rounds)

The calibrated device then uses it as its ``matmul_efficiency`` and ``memory_efficiency`` (the achievable
fraction of the measured rates, the role those fields play for the datasheet presets), clamped to (0, 1]:
every op's roofline time is divided by it. One factor for both because a step's deficit is spread over
matmuls and memory-bound ops alike (above); the launch and optimizer constants are not scaled (measured
directly). A model whose op mix differs from the reference (e.g. an MLP of large matmuls only) is priced
with the reference's factor: the residual is that model's own in-step behaviour.
"""
from __future__ import annotations

import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from cost_model._fx import node_values, op_nodes
from cost_model.compute import op_cost
from cost_model.hardware import DeviceSpec

__all__ = ["REFERENCE_SHAPE", "reference_model", "price_reference_s", "time_reference_s", "step_efficiency"]

# (layers, hidden, heads, vocab, batch, seq): a small LM whose ops take 0.1-10 ms each on one CPU thread.
REFERENCE_SHAPE = (2, 384, 6, 4096, 4, 128)


class _Block(nn.Module):
    """Pre-LN transformer block (Radford et al. 2019): x + attn(ln(x)), then x + mlp(ln(x)); causal softmax
    attention written out (matmul, mask, softmax, matmul) as eager models do; GELU (tanh) MLP of 4 x hidden."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc, self.out = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(h // self.heads)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        attn = torch.matmul(scores.masked_fill(~causal, float("-inf")).softmax(-1), v)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class _ReferenceLM(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, vocab: int, seq: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(_Block(hidden, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def reference_model(shape: tuple[int, ...] = REFERENCE_SHAPE) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The reference LM (module docstring) with seeded weights and its inputs: ``ids`` and ``labels`` of
    (batch, seq) int64 tokens. Returns (model, (ids, labels)); the model returns the scalar loss."""
    layers, hidden, heads, vocab, batch, seq = shape
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = _ReferenceLM(layers, hidden, heads, vocab, seq)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    return model, (ids, torch.roll(ids, -1, dims=1))


def price_reference_s(device: DeviceSpec, shape: tuple[int, ...] = REFERENCE_SHAPE) -> float:
    """Priced seconds of the reference step's forward + backward on ``device``: ``op_cost`` of every ATen node
    of its torch.export graph (unfused: eager CPU kernels)."""
    model, inputs = reference_model(shape)
    graph = torch.export.export(model, inputs).graph_module
    total = 0.0
    for node in op_nodes(graph):
        args, kwargs, out = node_values(node)
        total += op_cost(node.target, args, kwargs, out, device).total_s
    return total


def time_reference_s(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> float:
    """Wall seconds of one forward + backward of the reference in this process (gradients set to None
    first, as a training step's ``zero_grad``)."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    model(*inputs).backward()
    return time.perf_counter() - start


def step_efficiency(priced_s: float, measured_s: list[float]) -> float:
    """``priced_s / median(measured_s)`` clamped to (0, 1] (module docstring).

    Raises:
        ValueError: no measurement, or a non-positive time.
    """
    if not measured_s or priced_s <= 0 or min(measured_s) <= 0:
        raise ValueError(f"step_efficiency: priced {priced_s!r} s, measured {measured_s!r} s: need a positive "
                         "priced time and >= 1 positive measurement")
    return min(1.0, priced_s / statistics.median(measured_s))
