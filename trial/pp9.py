"""Factories with batch= for `parallelizer plan --mesh pp=2,dp=2` + `rehearse --nproc 4` (round 9, r9a)."""
import torch
import transformers as T

from parallelizer.zoo.families import _build

import models9 as M


def olmoe(batch=4, seq_len=16, device="cpu"):
    ids = torch.randint(0, M.V, (batch, seq_len), generator=M._g(1))
    m = _build(T.OlmoeConfig, T.OlmoeForCausalLM, dict(M.TXT, num_experts=8, num_experts_per_tok=2), 0, device)
    return m, (ids.to(device),), {"labels": ids.to(device)}


def levit(batch=4, device="cpu"):
    m = M.levit(device=device)[0]
    x = torch.randn(batch, 3, 32, 32, generator=M._g(1))
    return m, (x.to(device),), {"labels": torch.arange(batch).remainder(3).to(device)}


def segformer(batch=4, device="cpu"):
    m = M.segformer(device=device)[0]
    x = torch.randn(batch, 3, 32, 32, generator=M._g(1))
    return m, (x.to(device),), {"labels": torch.randint(0, 3, (batch, 32, 32), generator=M._g(2)).to(device)}
