"""Write the configuration this run resolved (config.yaml + overlays) for the other scripts to read."""

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from mmkit.atomic import write_text_atomic  # noqa: E402

write_text_atomic(snakemake.output[0], yaml.safe_dump(dict(snakemake.params.config), sort_keys=False))  # noqa: F821
