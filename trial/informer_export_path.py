"""Informer / Autoformer (tiny, default options) run eagerly but fail under torch.export: transformers 5.24's
masking_utils builds the attention mask when traced that an eager call skips, and ProbSparse / auto-correlation
attention reject its size. Before 7b17184 the TraceError said "model(*inputs) fails the same way" (false)."""
import sys
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import parallelizer
import hf_models as H

if __name__ == "__main__":
    for name in ("informer", "autoformer"):
        m, a, k = getattr(H, name)()
        m(*a, **k)
        print(name, "runs eagerly")
        try:
            parallelizer.trace(m, a, k)
        except parallelizer.TraceError as e:
            print(name, "TraceError:", str(e).splitlines()[0][:300])
