"""write_text.py OUT TEXT: commit TEXT to OUT atomically (a job's settings file, the settings table).

Imports nothing heavy, so these small jobs cost a Python start and no more.
"""

import sys

from mmkit.atomic import write_text_atomic
from mmkit.errors import run_cli


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.splitlines()[0])
    write_text_atomic(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    run_cli(main)
