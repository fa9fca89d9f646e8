"""The codebase's layout limits: file and function sizes, downward imports only.

Files: at most 500 lines outside tests. Functions: at most 80 lines, not
counting Pallas kernel bodies (functions named ``kernel`` or ``*_kernel``
inside tetrajet_jax/kernels, also where nested in their launch wrapper). Imports: a kernel module imports nothing from
the layer or above, the library never imports ``experiments``, and neither the
library nor the tests use importlib.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
# The package's layers, bottom to top; a module may import its own layer or lower ones.
LAYERS = (("numerics", "tree_paths"), ("kernels",), ("linear",), ("nn", "optim"),
          ("model", "data", "evaluation"), ("train",))


def _sources() -> list[Path]:
  out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
  return [ROOT / p for p in out.split() if (ROOT / p).exists()]


# Waiting for a split of its launch code (its kernel math changes in a parallel branch).
KNOWN_LONG: set[str] = set()


def _is_kernel_body(path: Path, fn: ast.FunctionDef) -> bool:
  return "tetrajet_jax/kernels/" in path.as_posix() and (fn.name == "kernel" or fn.name.endswith("_kernel"))


def _length(path: Path, fn: ast.FunctionDef) -> int:
  """Lines of `fn`, without the Pallas kernel bodies nested in it."""
  n = fn.end_lineno - fn.lineno + 1
  for node in ast.walk(fn):
    if node is not fn and isinstance(node, ast.FunctionDef) and _is_kernel_body(path, node):
      n -= node.end_lineno - node.lineno + 1
  return n


def test_no_source_file_over_the_limit():
  long = [f"{p.relative_to(ROOT)}: {n}" for p in _sources() if not p.relative_to(ROOT).parts[0] == "tests"
          for n in [len(p.read_text(encoding="utf-8").splitlines())] if n > MAX_FILE_LINES]
  assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_no_function_over_the_limit():
  long = []
  for p in _sources():
    for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_kernel_body(p, node):
        n = _length(p, node)
        if n > MAX_FUNCTION_LINES and f"{p.relative_to(ROOT)}:{node.name}" not in KNOWN_LONG:
          long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
  assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def _imports(path: Path) -> list[str]:
  names = []
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names.append(node.module)
      names += [f"{node.module}.{a.name}" for a in node.names]
  return names


def _layer(module: str) -> int | None:
  parts = module.split(".")
  if parts[0] != "tetrajet_jax" or len(parts) < 2:
    return None
  for i, names in enumerate(LAYERS):
    if parts[1] in names:
      return i
  return None


@pytest.mark.parametrize("path", [p for p in _sources() if p.relative_to(ROOT).parts[0] == "tetrajet_jax"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_library_imports_point_down(path):
  # A package's __main__ is a command-line entry point, not a layer member: it may dispatch upwards
  # (python -m tetrajet_jax.evaluation --run evaluates a training run through the train layer).
  own = None if path.name == "__main__.py" else _layer(".".join(path.relative_to(ROOT).with_suffix("").parts))
  for name in _imports(path):
    assert not name.startswith("experiments"), f"{path.name} imports {name}: the library never imports experiments"
    assert not name.startswith("importlib"), f"{path.name} uses importlib"
    other = _layer(name)
    if own is not None and other is not None:
      assert other <= own, f"{path.relative_to(ROOT)} (layer {LAYERS[own]}) imports {name} (layer {LAYERS[other]})"


def test_tests_do_not_use_importlib():
  users = [p.name for p in _sources() if p.relative_to(ROOT).parts[0] == "tests" and p.name != "test_layout.py"
           and "importlib" in p.read_text(encoding="utf-8")]
  assert not users, users


def test_the_checks_catch_an_upward_import(tmp_path):
  # The layer check must be able to fail: a kernel module importing the layer.
  assert _layer("tetrajet_jax.linear.layer") > _layer("tetrajet_jax.kernels.nvfp4_gemm")
  bad = tmp_path / "m.py"
  bad.write_text("from tetrajet_jax.linear import layer\nimport importlib\n")
  assert "tetrajet_jax.linear" in _imports(bad) and "importlib" in _imports(bad)
