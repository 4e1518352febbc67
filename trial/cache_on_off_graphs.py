"""For each family: trace with the config's use_cache=True and with use_cache=False; compare the traced graphs
(canonical op sequence) and the traced values with eager (use_cache=True) on one device."""
import sys, warnings
import torch
import parallelizer
from parallelizer.zoo import families as F

def canon(traced):
    gm = traced.graph_module
    idx = {}
    out = []
    for i, n in enumerate(gm.graph.nodes):
        idx[n] = i
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: f"%{idx[a]}")
        out.append((n.op, str(n.target) if n.op != "placeholder" else n.name, str(args)))
    return out

def extra(name):
    sizes = dict(num_key_value_heads=2)
    if name == "mistral_sw": return F._causal_lm("MistralConfig", "MistralForCausalLM", 0, "cpu", num_key_value_heads=2, sliding_window=4)
    if name == "gemma2": return F._causal_lm("Gemma2Config", "Gemma2ForCausalLM", 0, "cpu", head_dim=8, sliding_window=4, **sizes)
    if name == "gemma3": return F._causal_lm("Gemma3ForCausalLM".replace("ForCausalLM", "TextConfig"), "Gemma3ForCausalLM", 0, "cpu", head_dim=8, sliding_window=4, **sizes)
    if name == "qwen3_moe": return F._causal_lm("Qwen3MoeConfig", "Qwen3MoeForCausalLM", 0, "cpu", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, **sizes)
    if name == "recurrent_gemma": return F._causal_lm("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM", 0, "cpu", num_key_value_heads=1, lru_width=32, attention_window_size=8, block_types=["recurrent", "attention"])
    if name == "jamba": return F._causal_lm("JambaConfig", "JambaForCausalLM", 0, "cpu", num_experts=2, num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=4, mamba_d_conv=2, mamba_expand=2, use_mamba_kernels=False, **sizes)
    return F.FAMILIES[name]()

def first(o):
    from torch.utils import _pytree as pytree
    return [t for t in pytree.tree_leaves(o) if isinstance(t, torch.Tensor)]

if __name__ == "__main__":
    names = sys.argv[1:] or ["gpt2", "llama", "mistral_sw", "gemma2", "gemma3", "qwen3_moe", "t5", "bart", "mamba", "recurrent_gemma", "jamba"]
    for name in names:
        try:
            model, args, kwargs = extra(name)
            caching = [m.config for m in model.modules() if getattr(getattr(m, "config", None), "use_cache", None)]
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                on = parallelizer.trace(model, args, kwargs)
            eager = first(model(*args, **kwargs))
            got = first(on.exported.module()(*args, **kwargs))
            d_on = max((a - b).abs().max().item() for a, b in zip(eager, got) if a.is_floating_point())
            for c in caching: c.use_cache = False
            off = parallelizer.trace(model, args, kwargs)
            got_off = first(off.exported.module()(*args, **kwargs))
            d_off = max((a - b).abs().max().item() for a, b in zip(eager, got_off) if a.is_floating_point())
            same = canon(on) == canon(off)
            diff = ""
            if not same:
                a, b = canon(on), canon(off)
                i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                diff = f" first difference at {i}: on={a[i] if i < len(a) else None} off={b[i] if i < len(b) else None} (lens {len(a)} {len(b)})"
            print(f"{name}: caching configs={len(caching)} same_graph={same} |on-eager|={d_on:.2e} |off-eager|={d_off:.2e} "
                  f"warnings={[str(x.message)[:80] for x in w]}{diff}", flush=True)
        except Exception as e:
            print(f"{name}: ERROR {type(e).__name__}: {str(e)[:400]}", flush=True)
