"""Round 16 (r16c): settle a rehearsal's DIFFER as rounding or a wrong program.

For each case: `rehearse` of the float32 plan (its own verdict: float64 judge and, outside both judges, the
float64 replay of `runtime.replay64` in its reference text), then the SAME plan (spec) traced and run on the
float64 copy of the model (`runtime.widen`, inputs widened), one forward and backward, its gradients against
eager float64 (`replay64_rank`): a right program lands ~1e-13 from the float64 model, a wrong one stays as far
off as in float32. Cases: DAB-DETR (round 15, r15b; loss outside the model, fixed matching), DepthPro tp=2
(round 9), MobileViTV2 tp=2 and random-cost tp=2 (round 10, r10a). Usage (PYTHONPATH=.:trial):
python trial/r16c_replay64.py NAME[,NAME] PLAN[,PLAN], PLAN in ddp, fsdp, tp2, rnd_tp2_s1, rnd_dp2_s2."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F
import transformers as T

import parallelizer
from parallelizer.config import PlanConfig
from parallelizer.fingerprint import graph_fingerprint
from parallelizer.planner.api import build as build_problem, to_plan
from parallelizer.planner.ilp import solve
from parallelizer.rewriter.spec import spec_from_plan
from parallelizer.runtime.rehearsal import rehearse_many
from parallelizer.runtime.widen import as_float64
from parallelizer.zoo.families import _build

PLANS = {"ddp": ({"dp": 2}, {"dp": "ddp"}, None), "fsdp": ({"dp": 2}, {"dp": "fsdp"}, None),
         "tp2": ({"tp": 2}, {"tp": "tp"}, None), "rnd_tp2_s1": ({"tp": 2}, {}, 1), "rnd_dp2_s2": ({"dp": 2}, {}, 2)}


def _img(b=4, h=32, w=32):
    return torch.randn(b, 3, h, w, generator=torch.Generator().manual_seed(1))


class FixedMatchDetr(torch.nn.Module):
    """r15b's DETR-style loss outside the model: sigmoid focal loss, L1 + GIoU of query i <-> box i."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, pixel_values, cls, boxes):
        out = self.m(pixel_values=pixel_values)
        logits, pred = out.logits, out.pred_boxes
        b, k = cls.shape
        q, c = logits.shape[1], logits.shape[-1]
        tgt = torch.zeros_like(logits)
        tgt[:, :k] = F.one_hot(cls, c).to(logits.dtype)
        p = logits.sigmoid()
        ce = F.binary_cross_entropy_with_logits(logits, tgt, reduction="none")
        pt = p * tgt + (1 - p) * (1 - tgt)
        loss_cls = ((0.25 * tgt + 0.75 * (1 - tgt)) * ce * (1 - pt) ** 2).mean(1).sum() / (b * k) * q
        pm = pred[:, :k]

        def xyxy(x):
            cx, cy, w, h = x.unbind(-1)
            return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)

        a, t = xyxy(pm), xyxy(boxes)
        inter = (torch.min(a[..., 2:], t[..., 2:]) - torch.max(a[..., :2], t[..., :2])).clamp(min=0).prod(-1)
        union = (a[..., 2:] - a[..., :2]).prod(-1) + (t[..., 2:] - t[..., :2]).prod(-1) - inter
        hull = (torch.max(a[..., 2:], t[..., 2:]) - torch.min(a[..., :2], t[..., :2])).clamp(min=0).prod(-1)
        giou = inter / union - (hull - union) / hull
        return loss_cls + 5 * (pm - boxes).abs().sum() / (b * k) + 2 * (1 - giou).sum() / (b * k), logits


def dab_detr():
    torch.manual_seed(0)
    backbone = T.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                              layer_type="basic", out_features=["stage2"])
    cfg = T.DabDetrConfig(use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False,
                          hidden_size=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, num_queries=6,
                          num_labels=3, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                          encoder_layerdrop=0.0, decoder_layerdrop=0.0, auxiliary_loss=False)
    g = torch.Generator().manual_seed(5)
    cls = torch.randint(0, 3, (4, 2), generator=g)
    boxes = torch.cat([torch.rand(4, 2, 2, generator=g) * 0.6 + 0.2, torch.rand(4, 2, 2, generator=g) * 0.3 + 0.1], -1)
    return FixedMatchDetr(T.DabDetrForObjectDetection(cfg)), (_img(), cls, boxes), {}


def depth_pro(seed=0, device="cpu"):
    """Round 9's DepthProForDepthEstimation (trial/models9.py at 20ef712)."""
    enc = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
               patch_size=8)
    m = _build(T.DepthProConfig, T.DepthProForDepthEstimation,
               dict(fusion_hidden_size=16, patch_size=32, intermediate_hook_ids=[1, 0],
                    intermediate_feature_dims=[16, 16], scaled_images_ratios=[0.5, 1.0],
                    scaled_images_overlap_ratios=[0.0, 0.5], scaled_images_feature_dims=[16, 16],
                    image_model_config=dict(enc, model_type="dinov2"),
                    patch_model_config=dict(enc, model_type="dinov2"),
                    fov_model_config=dict(enc, model_type="dinov2"), use_fov_model=True, num_fov_head_layers=1),
               seed, device)
    return m, (_img(h=64, w=64),), {}


def mobilevitv2():
    torch.manual_seed(0)
    cfg = T.MobileViTV2Config(image_size=64, num_labels=3, width_multiplier=0.25, hidden_dropout_prob=0.0,
                              attn_dropout=0.0, classifier_dropout_prob=0.0)
    labels = torch.tensor([0, 1, 2, 1])
    return T.MobileViTV2ForImageClassification(cfg), (_img(h=64, w=64),), {"labels": labels}


def _wide(name):
    model, args, kwargs = globals()[name]()
    widen = lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
    return as_float64(model), tuple(widen(a) for a in args), {k: widen(v) for k, v in kwargs.items()}


def dab_detr64():
    return _wide("dab_detr")


def depth_pro64(seed=0, device="cpu"):
    return _wide("depth_pro")


def mobilevitv264():
    return _wide("mobilevitv2")


def plan_of(fn, mesh, roles, seed):
    model, args, kwargs = fn()
    with contextlib.redirect_stdout(io.StringIO()):
        traced = parallelizer.trace(model, args, kwargs)
        if seed is None:
            return parallelizer.plan(traced, mesh, axis_roles=roles)
        config = PlanConfig(axis_roles=roles)
        problem, pricer = build_problem(traced, parallelizer.core.MeshSpec(tuple(mesh), tuple(mesh.values())),
                                        config=config)
        rng = np.random.default_rng(seed)  # random ILP costs: plans no cost model would pick
        problem.lin = [np.where(np.isfinite(v), rng.random(v.shape), v) for v in problem.lin]
        problem.pairs = {k: np.where(np.isfinite(m), rng.random(m.shape), m) for k, m in problem.pairs.items()}
        p = to_plan(traced, problem, pricer, solve(problem, config), config)
        return dataclasses.replace(p, fingerprint=graph_fingerprint(traced))


def replay64_rank(rank: int, world_size: int, builder_name: str, spec) -> dict | None:
    """The plan `spec` (made for the float32 model) on the float64 copy: traced and run within `widening()`
    (the graph's own zeros / arange / casts in float64), one forward and backward; rank 0 returns
    (worst |grad - float64 eager grad|, its name, worst ratio to float64's torch.testing bound)."""
    import r16c_replay64 as builders
    from parallelizer.rewriter.spec import all_axis_groups
    from parallelizer.rewriter.state import gather_tensor
    from parallelizer.runtime.launch import create_groups
    from parallelizer.runtime.module import ParallelModule
    from parallelizer.runtime.widen import widening

    torch.manual_seed(0)
    model, args, kwargs = getattr(builders, builder_name + "64")()
    torch.manual_seed(0)
    eager, eargs, ekwargs = getattr(builders, builder_name + "64")()
    with widening():
        traced = parallelizer.trace(model, args, kwargs)
        create_groups(all_axis_groups(spec.mesh))
        pm = ParallelModule(traced, spec, rank, model)
        out = pm(*args, **kwargs)
    from parallelizer.runtime.rehearsal import _loss  # the rehearsal's loss: the model's own 0-d one, else weighted

    with widening():
        loss, ref_loss = _loss(out), _loss(eager(*eargs, **ekwargs))
    loss.backward()
    ref_loss.backward()
    worst = (0.0, "", 0.0)
    for name, p in pm.named_parameters():
        full = gather_tensor(p.grad if p.grad is not None else torch.zeros_like(p), spec.params[name], spec.mesh,
                             pm.groups, tuple(traced.parameters[name].shape), pm.coords)
        expected = eager.get_parameter(name).grad
        expected = torch.zeros_like(full) if expected is None else expected
        diff = (full - expected).abs()
        ratio = (diff / (1e-7 + 1e-7 * expected.abs())).max().item()
        worst = max(worst, (diff.max().item(), name, ratio))
    return {"dtype": str(loss.dtype), "worst": worst} if rank == 0 else None


if __name__ == "__main__":
    import r16c_replay64 as builders  # ranks unpickle builders by module: not __main__ (PYTHONPATH holds trial/)
    from parallelizer.runtime.launch import spawn

    warnings.simplefilter("ignore")
    names, plans = sys.argv[1].split(","), sys.argv[2].split(",")
    for name in names:
        specs = {pn: spec_from_plan(plan_of(getattr(builders, name), *PLANS[pn])) for pn in plans}
        reports = rehearse_many([(getattr(builders, name), {}, specs[pn]) for pn in plans], steps=2, timeout_s=1500)
        for pn, report in zip(plans, reports):
            print(f"{name} {pn} float32 rehearse: {'MATCH' if report.matches() else 'DIFFER'} "
                  f"ratio={report.tolerance_ratio:.3g} grad={report.grad:.2g} ({report.worst_grad}) "
                  f"params={report.params:.2g} | {report.reference}", flush=True)
            got = spawn(builders.replay64_rank, 2, name, specs[pn], timeout_s=900)[0]
            diff, where, ratio = got["worst"]
            print(f"{name} {pn} the same plan in float64 ({got['dtype']}): worst |grad - float64 eager| {diff:.2g} "
                  f"({where}), {ratio:.3g} of float64's bound (1e-7 + 1e-7 |ref|)", flush=True)
