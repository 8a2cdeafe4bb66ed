"""python -m certkit: the certify command."""

from certkit.cli import run

run()
