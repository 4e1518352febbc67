"""Round 10a probe: what real data loaders feed (shapes, kinds, HF conventions) on 2 ranks, ddp/tp/fsdp.
Run: python trial/probe_inputs.py [roles]  -> prints one line per case."""
import copy
import sys

import torch

from probe_common import B, T, V, bert, compare, err, grad_ratio, ids, leaf, llama


def lab(b=B, t=T, seed=2):
    y = ids(b, t, seed)
    y[0, :3] = -100
    return y


def cases():
    """name -> (builder, trace_args, trace_kwargs, [(mode, args, kwargs, readout, backward)])"""
    x = ids()
    y = lab()
    mask = torch.ones(B, T, dtype=torch.long)
    left = mask.clone(); left[1, :3] = 0
    right = mask.clone(); right[2, 5:] = 0
    full_pad = mask.clone(); full_pad[3] = 0
    yl = y.clone(); yl[1, :3] = -100
    yfp = y.clone(); yfp[3] = -100
    kw = dict(attention_mask=mask, labels=y)
    c = {}
    c["eval_batch3"] = (llama, (x,), {}, [("train", (x,), {}, ".logits.sum()", True),
                                         ("eval", (ids(3),), {}, ".logits", False)])
    c["eval_batch1"] = (llama, (x,), {}, [("eval", (ids(1),), {}, ".logits", False)])
    c["eval_seq1"] = (llama, (x,), {}, [("eval", (ids(B, 1),), {}, ".logits", False)])
    c["nograd_train_batch3"] = (llama, (x,), {}, [("nograd", (ids(3),), {}, ".logits", False)])
    c["train_batch3"] = (llama, (x,), {}, [("train", (ids(3),), {}, ".logits.sum()", True)])
    c["int32_ids"] = (llama, (x,), {}, [("train", (x.int(),), {}, ".logits.pow(2).mean()", True)])
    c["noncontig_ids"] = (llama, (x,), {}, [("train", (ids(B, 2 * T)[:, ::2],), {}, ".logits.pow(2).mean()", True)])
    c["transposed_ids"] = (llama, (x,), {}, [("train", (ids(T, B).t(),), {}, ".logits.pow(2).mean()", True)])
    c["kw_left_pad"] = (llama, (), kw, [("train", (), dict(input_ids=x, attention_mask=left, labels=yl), ".loss", True)])
    c["kw_left_pad_traced"] = (llama, (), dict(input_ids=x, attention_mask=left, labels=yl),
                               [("train", (), dict(input_ids=x, attention_mask=left, labels=yl), ".loss", True)])
    c["kw_right_pad"] = (llama, (), dict(input_ids=x, **kw),
                         [("train", (), dict(input_ids=x, attention_mask=right, labels=y), ".loss", True)])
    c["kw_full_pad_row"] = (llama, (), dict(input_ids=x, **kw),
                            [("train", (), dict(input_ids=x, attention_mask=full_pad, labels=yfp), ".loss", True)])
    c["kw_order"] = (llama, (), dict(input_ids=x, **kw),
                     [("train", (), dict(labels=y, attention_mask=mask, input_ids=x), ".loss", True)])
    pos = torch.arange(T).repeat(B, 1); pos[1] = torch.clamp(torch.arange(T) - 3, min=0)
    c["position_ids"] = (llama, (), dict(input_ids=x, position_ids=pos, labels=y),
                         [("train", (), dict(input_ids=x, position_ids=pos.flip(0), labels=y), ".loss", True)])
    c["hidden_states"] = (llama, (x,), dict(output_hidden_states=True),
                          [("train", (x,), dict(output_hidden_states=True), ".hidden_states[-1].pow(2).mean()", True)])
    c["attentions"] = (llama, (x,), dict(output_attentions=True),
                       [("train", (x,), dict(output_attentions=True), ".attentions[0].pow(2).mean()", True)])
    c["return_dict_false"] = (llama, (x,), dict(labels=y, return_dict=False),
                              [("train", (x,), dict(labels=y, return_dict=False), "[1].mean()", True)])
    n = (y != -100).sum() + 7
    c["num_items"] = (llama, (x,), dict(labels=y, num_items_in_batch=n),
                      [("train", (x,), dict(labels=y, num_items_in_batch=n + 5), ".loss", True)])
    c["num_items_int"] = (llama, (x,), dict(labels=y, num_items_in_batch=50),
                          [("train", (x,), dict(labels=y, num_items_in_batch=50), ".loss", True)])
    c["use_cache_train"] = (llama, (x,), dict(labels=y),
                            [("train", (x,), dict(labels=y, use_cache=True), ".loss", True)])
    c["meta_input"] = (llama, (x,), {}, [("train", (x.to("meta"),), {}, ".logits.sum()", False)])
    c["bert_tt"] = (bert, (x,), dict(token_type_ids=(x % 2), labels=torch.tensor([0, 1, 2, 1])),
                    [("train", (x,), dict(token_type_ids=1 - x % 2, labels=torch.tensor([2, 1, 0, 0])), ".loss", True)])
    c["embeds_req_grad"] = (llama, (), dict(inputs_embeds=torch.randn(B, T, 32)),
                            [("train", (), dict(inputs_embeds=torch.randn(B, T, 32).requires_grad_()),
                              ".logits.pow(2).mean()", True)])
    c["embeds_bf16"] = (llama, (), dict(inputs_embeds=torch.randn(B, T, 32)),
                        [("train", (), dict(inputs_embeds=torch.randn(B, T, 32).bfloat16()), ".logits.pow(2).mean()", True)])
    c["embeds_f64"] = (llama, (), dict(inputs_embeds=torch.randn(B, T, 32)),
                       [("train", (), dict(inputs_embeds=torch.randn(B, T, 32).double()), ".logits.pow(2).mean()", True)])
    return c


def run_case(name, spec_roles, rank, mesh, case):
    import parallelizer
    builder, targs, tkw, calls = case
    model = builder()
    ref = copy.deepcopy(model)
    try:
        pm = parallelizer.auto_parallelize(model, targs, example_kwargs=tkw, mesh=mesh, axis_roles=spec_roles)
    except Exception as exc:  # noqa: BLE001
        return f"BUILD {err(exc)}"
    res = []
    for mode, args, kw, path, backward in calls:
        for m in (pm, ref):
            m.train(mode != "eval")
            m.zero_grad(set_to_none=True)
        try:
            ctx = torch.no_grad() if mode in ("eval", "nograd") else torch.enable_grad()
            with ctx:
                e_out = leaf(ref(*args, **kw), path)
        except Exception as exc:  # noqa: BLE001
            e_out = exc
        try:
            with ctx:
                p_out = leaf(pm(*args, **kw), path)
        except Exception as exc:  # noqa: BLE001
            res.append(f"{mode}: pm {err(exc)} | eager {'ok' if not isinstance(e_out, Exception) else err(e_out)}")
            continue
        if isinstance(e_out, Exception):
            res.append(f"{mode}: pm ran but eager raised {err(e_out)}")
            continue
        r = compare(p_out, e_out) if p_out.shape == e_out.shape else f"shape {tuple(p_out.shape)} vs {tuple(e_out.shape)}"
        s = f"{mode}: out ratio {r}"
        if isinstance(r, float) and r > 1:  # rounding? compare against a float64 copy of the eager model
            ref64 = copy.deepcopy(ref).double()
            a64 = tuple(t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in args)
            k64 = {k: (t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t) for k, t in kw.items()}
            with torch.no_grad():
                o64 = leaf(ref64(*a64, **k64), path)
            s += (f" [f64: pm off {(p_out.double() - o64).abs().max().item():.3g}, eager32 off "
                  f"{(e_out.double() - o64).abs().max().item():.3g}]")
        if backward:
            p_out.backward(); e_out.backward()
            g, gname = grad_ratio(pm, ref)
            s += f" grad ratio {g:.3g} ({gname})"
            for t in list(args) + list(kw.values()):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    s += f" input-grad? {t.grad is not None}"
        res.append(s)
    return " || ".join(res)


def rank_fn(rank, world, mesh, roles, only, source="probe_inputs"):
    import importlib
    import warnings
    warnings.simplefilter("ignore")
    out = {}
    for name, case in importlib.import_module(source).cases().items():
        if only and name not in only:
            continue
        try:
            out[name] = run_case(name, roles, rank, mesh, case)
        except Exception as exc:  # noqa: BLE001
            import traceback
            out[name] = "HARNESS " + err(exc) + traceback.format_exc()[-600:]
    return out


if __name__ == "__main__":
    from parallelizer.runtime.launch import spawn
    which = sys.argv[1] if len(sys.argv) > 1 else "ddp"
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else None
    mesh, roles = {"ddp": ({"dp": 2}, {"dp": "ddp"}), "fsdp": ({"dp": 2}, {"dp": "fsdp"}),
                   "tp": ({"tp": 2}, {"tp": "tp"}),
                   "dptp": ({"dp": 2, "tp": 2}, {"dp": "ddp", "tp": "tp"})}[which]
    world = 4 if which == "dptp" else 2
    res = spawn(rank_fn, world, mesh, roles, only, timeout_s=1500)
    for name in res[0]:
        print(f"[{which}] {name}: {res[0][name]}")
        if any(r[name] != res[0][name] for r in res[1:]):
            print(f"    other ranks differ: {[r[name] for r in res[1:]]}")
