"""Make the worker module of these tests importable by name, in pytest and in the spawned ranks.

Spawned ranks import the module of the function they run; they inherit this process's sys.path.
"""
import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
