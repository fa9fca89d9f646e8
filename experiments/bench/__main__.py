"""The benchmark command: ``python -m experiments.bench {all,kernels,recipes,train,lowering,profile,triton-isa,doc} [options]``
(`all`: every section in turn, then the performance document; `experiments/bench/suite.py`)."""

from __future__ import annotations

import sys

from experiments.bench import kernels, lowering, performance_doc, recipes, step_profile, suite, train_steps, triton_isa

COMMANDS = {"all": suite.main, "kernels": kernels.main, "recipes": recipes.main, "train": train_steps.main,
            "lowering": lowering.main, "profile": step_profile.main, "triton-isa": triton_isa.main,
            "doc": performance_doc.main}


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if not argv or argv[0] not in COMMANDS:
    print(f"usage: python -m experiments.bench {{{','.join(COMMANDS)}}} [options]  (--help after a command)",
          file=sys.stderr)
    return 2
  COMMANDS[argv[0]](argv[1:])
  return 0


if __name__ == "__main__":
  sys.exit(main())
