"""`python bench/suite.py ...` is `specdec bench ...` (the suite itself lives in `specdec.benchmarks.suite`)."""

import sys

from specdec.cli.app import app

if __name__ == "__main__":
    app(["bench", *sys.argv[1:]])
