"""Trial h1: SwitchTransformers (and LongT5 transient-global) run eagerly but fail to trace: transformers skips
building the default attention_mask when `is_torchdynamo_compiling()` (True under torch.export). The TraceError
claimed "model(*inputs) fails the same way", which is false here. Passing attention_mask explicitly traces."""
import sys, warnings
sys.path.insert(0, "trial")
import torch
import parallelizer
import h1_models as M

warnings.simplefilter("ignore")
for name in ("switch", "longt5tg"):
    m, a, k = M.build(name)
    print(name, "eager loss", float(m(*a, **k).loss))
    try:
        parallelizer.trace(m, a, k)
        print(name, "traced")
    except Exception as e:
        print(name, type(e).__name__, str(e)[:700])
    k2 = dict(k, attention_mask=torch.ones_like(a[0]))
    try:
        parallelizer.trace(m, a, k2); print(name, "with attention_mask: traced")
    except Exception as e:
        print(name, "with attention_mask:", type(e).__name__, str(e)[:300])
