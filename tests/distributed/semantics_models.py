"""Small models and rank bodies for test_semantics (importable by name in spawned ranks)."""
from __future__ import annotations

import torch

from parallelizer.rewriter.spec import all_axis_groups
from parallelizer.runtime import create_groups
from parallelizer.runtime.module import ParallelModule
from parallelizer.tracer.trace import trace


class BatchNormMLP(torch.nn.Module):
    """(B, 8) -> (B, 4): Linear, BatchNorm1d (running statistics are buffers), ReLU, Linear. The first
    Linear has no bias, as usual before a norm (BatchNorm removes a per-channel shift, so such a bias has a
    true gradient of zero, and AdamW would turn rounding noise into full steps on either side of a comparison)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 16, bias=False)
        self.bn = torch.nn.BatchNorm1d(16)
        self.down = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.bn(self.up(x))))


def batchnorm_mlp(batch: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    return BatchNormMLP().train(), (torch.randn(batch, 8, generator=torch.Generator().manual_seed(seed)),)


class Dropper(torch.nn.Module):
    """(B, C) -> (B, C): x * w then dropout(p=0.5); w is a parameter of ones."""

    def __init__(self, channels: int = 64) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(channels))
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(x * self.w)


def dropper(batch: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    return Dropper().train(), (torch.ones(batch, 64),)


class AttentionDropper(torch.nn.Module):
    """(B, H, T, D) -> (B, H, T, D): h = x * w, then scaled_dot_product_attention(h, h, h, dropout_p=0.5), whose
    dropout is drawn inside the op (no aten.dropout node); w is a parameter of ones."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * self.w
        return torch.nn.functional.scaled_dot_product_attention(h, h, h, dropout_p=0.5)


def attention_dropper(batch: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    return AttentionDropper().train(), (torch.ones(batch, 4, 8, 16),)


def run_outputs(rank: int, world_size: int, model_fn, spec) -> list[torch.Tensor]:
    """This rank's outputs of the sharded program (outputs as the spec lays them out)."""
    model, inputs = model_fn()
    pm = ParallelModule(trace(model, inputs), spec, rank, model)
    create_groups(all_axis_groups(spec.mesh))
    out = pm(*inputs)
    return [out.detach()] if isinstance(out, torch.Tensor) else [t.detach() for t in out]


def meta_vs_reference(rank: int, world_size: int, spec, kwargs: dict) -> tuple[float, float]:
    """Build the GPT on `meta`, materialise only local shards, gather them and run a forward on real
    inputs; compare with a CPU model initialised by the same rule. Returns the largest absolute
    differences of (parameters, outputs); (0.0, ~0.0) expected."""
    from parallelizer import zoo
    from parallelizer.rewriter.state import init_model_like_shards

    meta_model, meta_inputs = zoo.gpt(device="meta", **kwargs)
    pm = ParallelModule(trace(meta_model, meta_inputs), spec, rank, meta_model)
    assert all(p.device.type == "cpu" for p in pm.parameters())
    create_groups(all_axis_groups(spec.mesh))
    gathered = pm.full_state_dict()
    reference, inputs = zoo.gpt(**kwargs)
    init_model_like_shards(reference)
    params = max((gathered[k] - v).abs().max().item() for k, v in reference.state_dict().items())
    outputs = (pm(*inputs) - reference(*inputs)).abs().max().item()
    return params, outputs


def state_dict_round_trip(rank: int, world_size: int, spec, kwargs: dict) -> dict:
    """full_state_dict of a sharded GPT-2 (tied) vs the original model, strict load both ways."""
    from parallelizer import zoo

    model, inputs = zoo.gpt2(**kwargs)
    pm = ParallelModule(trace(model, inputs), spec, rank, model)
    create_groups(all_axis_groups(spec.mesh))
    full = pm.full_state_dict()  # like nn.Module.state_dict, replicated tensors share the live storage
    original = model.state_dict()
    result = {"keys_equal": sorted(full) == sorted(original),
              "bitwise": all(torch.equal(full[k], v) for k, v in original.items()),
              "sharded": any(tuple(p.shape) != tuple(original[f].shape) for f, p in pm.named_parameters())}
    fresh = zoo.gpt2(**kwargs, seed=1)[0]
    missing = fresh.load_state_dict(full, strict=True)
    result["strict_load_ok"] = (not missing.missing_keys and not missing.unexpected_keys
                                and all(torch.equal(fresh.state_dict()[k], v) for k, v in original.items()))
    other = zoo.gpt2(**kwargs, seed=2)[0].state_dict()
    pm.load_full_state_dict(other)
    back = pm.full_state_dict()
    result["reverse_bitwise"] = all(torch.equal(back[k], v) for k, v in other.items())
    return result
