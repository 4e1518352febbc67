"""`python -m parallelizer ...` runs the CLI (`parallelizer.cli`)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
