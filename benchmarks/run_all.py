"""`make bench`: run every benchmark module's `run()` and write benchmarks/RESULTS.md with the machine."""
from __future__ import annotations

import importlib
import pkgutil
import platform
import time
from pathlib import Path

import torch

import benchmarks


def machine() -> str:
    """One line naming the machine the figures were measured on."""
    return (f"{platform.node()} — {platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} torch threads, Python {platform.python_version()}, torch {torch.__version__}")


FUZZ_BEGIN, FUZZ_END = "<!-- make fuzz: begin -->", "<!-- make fuzz: end -->"


def kept_section(text: str) -> str:
    """The section `make fuzz` wrote into RESULTS.md (between its markers), or ""."""
    if FUZZ_BEGIN not in text or FUZZ_END not in text:
        return ""
    return text[text.index(FUZZ_BEGIN):text.index(FUZZ_END) + len(FUZZ_END)] + "\n"


def replace_section(text: str, section: str) -> str:
    """RESULTS.md text with the fuzzer's section replaced (or appended)."""
    block = f"{FUZZ_BEGIN}\n{section}\n{FUZZ_END}"
    if FUZZ_BEGIN in text and FUZZ_END in text:
        return text[:text.index(FUZZ_BEGIN)] + block + text[text.index(FUZZ_END) + len(FUZZ_END):]
    return text.rstrip() + "\n\n" + block + "\n"


def main() -> None:
    sections = [f"# Benchmark results\n\nMachine: {machine()}  \nDate: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"]
    for info in sorted(pkgutil.iter_modules(benchmarks.__path__), key=lambda m: m.name):
        if not info.name.startswith("bench_"):
            continue
        module = importlib.import_module(f"benchmarks.{info.name}")
        print(f"running {info.name} ...", flush=True)
        start = time.perf_counter()
        sections.append(module.run() + f"\n\n_{info.name}: {time.perf_counter() - start:.0f} s_\n")
    out = Path(__file__).with_name("RESULTS.md")
    kept = kept_section(out.read_text()) if out.exists() else ""  # the fuzzer's (make fuzz) stays
    out.write_text("\n".join(sections) + ("\n" + kept if kept else ""))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
