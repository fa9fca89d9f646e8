"""Benchmarks and timing: every speed measurement of the project, above the library.

  python -m experiments.bench kernels [...]   the Pallas kernels (quantizers, GEMM,
                                              the linear layer's attribution)
  python -m experiments.bench recipes [...]   each recipe's linear fwd+bwd vs bf16

Modules: `timing` (the timed loop, commit and device names), `jobs` (the
check-then-time harness, result rows and tables), `quantizers`, `gemms`,
`layer_parts` (the kernel sections), `kernels` and `recipes` (the two
commands).
"""
