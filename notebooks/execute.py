"""Execute notebooks in place, so that they are stored with their outputs and plots (`make notebooks`).

Run after changing a notebook or what it shows: `python notebooks/execute.py [NOTEBOOK.ipynb ...]` (default:
every notebook here). The kernel is "python3" of this interpreter (ipykernel's own spec); tests/test_notebooks.py
re-executes them and checks that the stored copies carry their outputs.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
# tqdm.auto warns in a kernel without ipywidgets ("IProgress not found"); that line (with this machine's paths)
# would be stored in every notebook. The kernel inherits this environment.
os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), "ignore:IProgress not found"]))


def execute(path: Path, timeout_s: int = 300) -> float:
    """Run every cell of `path` (working directory: this folder), write the outputs back; returns seconds."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv: list[str]) -> None:
    for path in [Path(a).resolve() for a in argv] or sorted(HERE.glob("*.ipynb")):
        print(f"{path.name}: {execute(path):.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
