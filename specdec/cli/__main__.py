"""`python -m specdec.cli ...` is `specdec ...`."""

from specdec.cli.app import main

main()
