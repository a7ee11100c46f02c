"""`python -m bench` (what `make bench` runs): see bench.run."""

import sys

from bench.run import main

if __name__ == "__main__":  # not again in the offset committers' spawned process
    sys.exit(main())
