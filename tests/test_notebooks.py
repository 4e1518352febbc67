"""Every notebook in notebooks/ executes without a cell error (nbclient, kernel = this interpreter; a cell
times out after 300 s; no speed target here, a loaded machine would fail it), and each notebook that plots
produces an image output; the copies in the repository are stored executed, with those outputs (`make
notebooks` refreshes them), so that a code host shows the plots."""
import json
import os
import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
PLOTTING = {"02_what_if.ipynb", "03_pipeline_schedule.ipynb"}


def _kernel_for_this_interpreter(tmp_path: Path, monkeypatch) -> str:
    """A kernelspec whose argv starts this interpreter (the venv's), found through JUPYTER_PATH."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec_dir = tmp_path / "kernels" / "parallelizer-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "parallelizer test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path) + os.pathsep + os.environ.get("JUPYTER_PATH", ""))
    assert "parallelizer-test" in KernelSpecManager().find_kernel_specs()
    return "parallelizer-test"


LONG = {"01_plan_gpt2.ipynb", "02_what_if.ipynb"}
"""Executed in `make test-long` only (about 30 s each; round 19: `make test` at 13:49 of CI's 15 minutes): their
stored copies are checked in `make test` (`test_notebook_is_stored_with_its_outputs`), and the notebooks that
stay executed here (schedules, bring your own model) exercise the same kernel, nbclient and plot path."""


@pytest.mark.slow
@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.long) if p.name in LONG else p
                                  for p in NOTEBOOKS], ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    kernel = _kernel_for_this_interpreter(tmp_path, monkeypatch)
    NotebookClient(nb, timeout=300, kernel_name=kernel, resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    if path.name in PLOTTING:
        assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} produced no plot"
    if path.name.startswith("01"):
        assert any("text/html" in o.get("data", {}) for o in outputs)  # Plan._repr_html_


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_with_its_outputs(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert all(c.get("execution_count") for c in code), f"{path.name}: run `make notebooks` before committing"
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert outputs and not [o for o in outputs if o.get("output_type") == "error"]
    if path.name in PLOTTING:
        assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} is stored without its plot"
