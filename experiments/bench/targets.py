"""docs/PERFORMANCE.md's targets, each against the newest figures for it among the rendered files.

The files are given newest first (the order docs/PERFORMANCE.md lists them in). For every
measured item (a kernel at its default tiling, the default GEMM tiles, the layer, an arm's
train step under the default variants) and shape, the first file that holds it supplies the
figure; an item's figures from one file share a row, which names that file's commit and card.
Whether a target is met is read off those figures; the card matters, since the targets are
set for an H200.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Callable

from experiments.bench import train_steps
from experiments.bench.gemms import GEMM_CONFIGS
from tetrajet_jax.kernels.nvfp4_gemm import DEFAULT_CONFIG
from tetrajet_jax.kernels.nvfp4_quantize_triton import quantize_nvfp4_rtn_triton


@dataclasses.dataclass(frozen=True)
class Target:
  text: str  # what the target says
  kind: str  # the rows' kind
  item: Callable[[dict], str | None]  # a row's item name, None for rows the target does not read
  value: str  # the row's ratio
  meets: Callable[[float], bool]


def default_triton_tiling() -> str:
  """The bench's name of the Triton quantizers' default tiling (`rows{block_rows}_w{num_warps}`)."""
  p = inspect.signature(quantize_nvfp4_rtn_triton).parameters
  return f"rows{p['block_rows'].default}_w{p['num_warps'].default}"


def default_gemm_config() -> str:
  """The bench's name of the layer's default GEMM tiles."""
  return next(name for name, config in GEMM_CONFIGS.items() if config == DEFAULT_CONFIG)


def _named(pattern: str) -> Callable[[dict], str | None]:
  return lambda row: row["name"] if re.fullmatch(pattern, row["name"]) else None


def _default_step(row: dict) -> str | None:
  """An FP4 arm's train step under every variant's default: unset, or set to the value this
  process runs (render without the variants' environment variables)."""
  if row["arm"] == "bf16" or "error" in row:
    return None
  if any(row.get(v.key) not in (None, v.current()) for v in train_steps.VARIANTS):
    return None
  return f"{row['model']} {row['arm']}"


def targets() -> list[Target]:
  tiling, gemm = re.escape(default_triton_tiling()), re.escape(default_gemm_config())
  return [
      Target("quantizers >= 0.7x a copy", "quant", _named(rf"triton (rtn|rht\+sr) \S+( axis=-?\d)? {tiling}"),
             "vs_copy", lambda v: v >= 0.7),
      Target("GEMM >= 0.9x the bf16 dot (pre-decoded operands)", "gemm",
             _named(rf"pallas block-scaled bf16 gemm {gemm}"), "vs_bf16", lambda v: v >= 0.9),
      Target("GEMM >= 0.9x the bf16 dot (FP4 operands, XLA decode)", "gemm",
             _named(rf"pallas nvfp4_gemm \(\+XLA decode\) {gemm}"), "vs_bf16", lambda v: v >= 0.9),
      Target("TetraJet-v2 linear forward + backward <= 1.3x bf16", "linear",
             _named(r"linear fwd\+bwd tetrajet_v2 backend=auto"), "vs_bf16", lambda v: v <= 1.3),
      Target("FP4 train step >= 0.7x bf16 tokens/s", "train", _default_step, "vs_bf16_tokens_per_s",
             lambda v: v >= 0.7),
      Target("FP4 step compile <= 3x bf16's", "train", _default_step, "vs_bf16_compile", lambda v: v <= 3.0),
  ]


def _rows(result: dict) -> list[dict]:
  """The file's rows, train rows with their ratios to the same model's bf16 row."""
  rows = result.get("rows", [])
  return ([r for r in rows if r.get("kind") != "train"]
          + train_steps.with_ratios([dict(r) for r in rows if r.get("kind") == "train"]))


def _shape(row: dict) -> str:
  shape = row.get("shape")
  return "x".join(map(str, shape)) if shape else ""


def table(results: list[tuple[str, dict]]) -> str:
  """The markdown table: one row per target, item and source file (results newest first)."""
  lines = ["| target | item | figures | met | from |", "|---|---|---|---|---|"]
  files = [(path, result, _rows(result)) for path, result in results]  # ratios once per file, for every target
  for t in targets():
    seen: set[tuple[str, str]] = set()
    for path, result, rows in files:
      found: dict[str, list[tuple[str, float]]] = {}
      for row in rows:
        item = row.get("kind") == t.kind and t.value in row and t.item(row)
        if item and (item, _shape(row)) not in seen:
          seen.add((item, _shape(row)))
          found.setdefault(item, []).append((_shape(row), row[t.value]))
      for item, figures in found.items():
        text = ", ".join(f"{s} {v:.2f}x".lstrip() for s, v in figures)
        met = "yes" if all(t.meets(v) for _, v in figures) else "no"
        device = str(result.get("device", "?")).removeprefix("gpu:")
        lines.append(f"| {t.text} | {item} | {text} | {met} | `{path.rsplit('/', 1)[-1]}` "
                     f"({device}, {str(result.get('commit', '?'))[:7]}) |")
  return "\n".join(lines)
