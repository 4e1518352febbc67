"""Planning time (trace excluded) on the model zoo: `python -m benchmarks.bench_planner`.

Cases: GPT-2 small (12 layers, batch 8 x 1024) on mesh (2, 4); a Llama-2-7B shape (meta device, batch 1 x seq
4096) on (8, 8) and (4, 4, 4); and GPT-2 with 2, 8, 32 layers on (2, 4) to show that time grows at most
linearly with depth (repeated blocks share ILP variables). `run()` returns a markdown table.
"""
from __future__ import annotations

import time

import parallelizer
from parallelizer import zoo
from parallelizer.core import MeshSpec
from parallelizer.planner import plan

_TARGETS_S = {"gpt2-small (2,4)": 5.0, "llama2-7b (8,8)": 30.0, "llama2-7b (4,4,4)": 60.0}


def _gpt2(n_layer: int):
    return zoo.gpt2(n_layer=n_layer, n_embd=768, n_head=12, vocab_size=50257, batch=8, seq_len=1024, device="meta")


def _llama7b():
    return zoo.llama(batch=1, seq_len=4096, device="meta", **zoo.llama2_7b_config())


def _case(name: str, build, mesh: MeshSpec) -> tuple[str, float, object]:
    traced = parallelizer.trace(*build())
    start = time.perf_counter()
    p = plan(traced, mesh, time_limit_s=120.0)
    return name, time.perf_counter() - start, p


def run() -> str:
    """Run every case; a markdown table of planning seconds, solver status, variables and estimated step."""
    cases = [
        ("gpt2-small (2,4)", lambda: _gpt2(12), MeshSpec(("dp", "tp"), (2, 4))),
        ("llama2-7b (8,8)", _llama7b, MeshSpec(("dp", "tp"), (8, 8))),
        ("llama2-7b (4,4,4)", _llama7b, MeshSpec(("pp", "dp", "tp"), (4, 4, 4))),
        ("gpt2 2 layers (2,4)", lambda: _gpt2(2), MeshSpec(("dp", "tp"), (2, 4))),
        ("gpt2 8 layers (2,4)", lambda: _gpt2(8), MeshSpec(("dp", "tp"), (2, 4))),
        ("gpt2 32 layers (2,4)", lambda: _gpt2(32), MeshSpec(("dp", "tp"), (2, 4))),
    ]
    rows = ["| case | plan time (s) | target (s) | solver | variables | groups | est. step (ms) | memory/dev (GB) |",
            "|---|---|---|---|---|---|---|---|"]
    for name, build, mesh in cases:
        name, seconds, p = _case(name, build, mesh)
        target = _TARGETS_S.get(name)
        s = p.solver
        rows.append(f"| {name} | {seconds:.2f} | {target if target else '-'} | {s.solver} {s.status} | "
                    f"{s.num_variables} | {s.num_groups} | {p.cost.total_s * 1e3:.2f} | "
                    f"{p.cost.memory_bytes['total'] / 1e9:.2f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(run())
