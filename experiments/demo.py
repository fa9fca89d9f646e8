"""``python -m experiments.demo`` (``make demo``): the ablation runner's embedded demo."""

import sys

from experiments.ablation import main

if __name__ == "__main__":
  sys.exit(main(["--preset", "demo", *sys.argv[1:]]))
