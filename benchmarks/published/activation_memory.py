"""Planner's activation bytes per transformer layer vs Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", Table 2), per layer, 2-byte activations, 1-byte dropout masks:
  no parallelism      s b h (34 + 5 a s / h)
  tensor parallel t   s b h (10 + 24/t + 5 a s / (h t))
  tp + sequence par.  s b h / t (34 + 5 a s / h)
  tp + selective rc   s b h (10 + 24/t)          (tp + sp + selective: 34 s b h / t)
  full recompute      2 s b h                     (tp + sp: 2 s b h / t)
The last columns: the memory-lean layout (`planner.api.plan(..., lean=True)`, `ilp.solve_lean`) that the
pipeline search gives a stage where memory binds, against the TP+SP rows.
GPT-2 (eager attention with s x s scores, or SDPA), GELU, dropout 0.1 everywhere, bf16, traced on meta;
per layer = plan(l=3).activations - plan(l=2).activations on the h100:1x8 preset, mesh {"tp": t} role tp.
"""
import sys
import parallelizer
from parallelizer import zoo
from parallelizer.planner.api import plan as solve_plan

S, B, H, A, V = (int(x) for x in (__import__("os").environ.get("H3_SHAPE", "2048,1,4096,32,1024").split(",")))


def traced(layers, attn):
    model, inputs = zoo.gpt2(n_layer=layers, n_embd=H, n_head=A, vocab_size=V, n_positions=S, batch=B, seq_len=S,
                             device="meta", dropout=0.1, activation_function="gelu", attn_implementation=attn)
    return parallelizer.trace(model, inputs)  # fp32, planned "bf16" (autocast): a bf16 trace widens row-parallel products (r24b)


def korthikanti(t, mode, flash):
    sbh, quad = S * B * H, (0 if flash else 5 * A * S / H)
    if mode == "none":
        return sbh * (10 + 24 / t + quad / t)
    if mode == "selective":
        return sbh * (10 + 24 / t)
    return 2 * sbh


if __name__ == "__main__":
    attn = sys.argv[1] if len(sys.argv) > 1 else "eager"
    tg = {l: traced(l, attn) for l in (2, 3)}
    print(f"attention={attn}, s={S} b={B} h={H} a={A}: 5as/h = {5*A*S/H:.0f}")
    print("| t | recompute | ours (x sbh) | Korthikanti TP row (x sbh) | ours/theirs | planner's choice | "
          "lean layout (x sbh) | TP+SP row (x sbh) | lean/TP+SP |")
    for t in (1, 2, 4, 8):
        for mode in ("none", "selective", "full"):
            per, raw = [], []
            try:
                for l in (2, 3):
                    p = parallelizer.plan(tg[l], {"tp": t}, cluster=f"h100:1x{t}", axis_roles={"tp": "tp"},
                                          precision="bf16", recompute=mode)
                    per.append(p.cost.memory_bytes["activations"]); raw.append(p.cost.memory_bytes["activations"]/(S*B*H))
            except Exception as e:  # noqa: BLE001
                print(f"| {t} | {mode} | {type(e).__name__}: {str(e)[:160]} |", flush=True)
                continue
            ours = (per[1] - per[0]) / (S * B * H)
            theirs = korthikanti(t, mode, attn != "eager") / (S * B * H)
            # the memory-lean layout the pipeline search gives a stage where memory binds (`ilp.solve_lean`)
            lean = [solve_plan(tg[l], {"tp": t}, cluster=f"h100:1x{t}", axis_roles={"tp": "tp"}, precision="bf16",
                               recompute=mode, lean=True).cost.memory_bytes["activations"] for l in (2, 3)]
            lean_sbh = (lean[1] - lean[0]) / (S * B * H)
            quad = 0 if attn != "eager" else 5 * A * S / H
            sp = {"none": (34 + quad) / t, "selective": 34 / t, "full": 2 / t}[mode]  # Table 2's TP+SP rows
            print(f"| {t} | {mode} | {ours:.3f} | {theirs:.3f} | {ours/theirs:.3f} | l=2 {raw[0]:.2f}, l=3 {raw[1]:.2f}; "
                  f"{sorted(set(dict(p.recompute).values()))} | {lean_sbh:.3f} | {sp:.3f} | {lean_sbh / sp:.3f} |", flush=True)
