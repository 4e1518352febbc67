"""Finding (trial5a h1): in-place writes through views of an activation on a mesh with an empty shard (batch 4
on dp=3 fsdp; tp=3 with random costs) raised torch's 'Output 0 of _EmptyShardGuard is a view and is being
modified inplace' on every rank. Fixed in 914956d.
    python trial/h1_empty_guard_views.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.argv = [sys.argv[0], "3", "in_place_views"]
import h1_run  # noqa: E402

if __name__ == "__main__":
    h1_run.main()
