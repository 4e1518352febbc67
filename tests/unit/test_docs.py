"""Issue 12 item 15: the user documentation lives in the repository. README links only to files that exist in
it (never outside), and docs/architecture.md explains the pipeline, the vocabulary and the notation that
`parallelizer show` prints."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_links_stay_inside_the_repository():
    text = (ROOT / "README.md").read_text()
    assert "../" not in text and "/work/" not in text and "shared/DESIGN.md" not in text
    targets = [t for t in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in t]
    assert "docs/architecture.md" in targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README links to files that are not in the repository: {missing}"


def test_architecture_notes_cover_pipeline_vocabulary_notation_and_layout():
    text = (ROOT / "docs" / "architecture.md").read_text()
    for needle in ("TracedGraph", "cost_model", "Plan", "ParallelModule", "mesh axis", "tensor dim", "`S(d)`",
                   "`R`", "`P`", '`S(0)R`', "stored layout", "use layout", "FSDP", "DDP", "Where each piece lives"):
        assert needle in text, needle
    paths = re.findall(r"`((?:parallelizer|cost_model)/[\w/]+(?:\.py|\.json)?)`", text)
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert paths and not missing, missing
