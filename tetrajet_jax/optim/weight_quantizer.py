"""What OsciReset watches: the forward weight quantizer, the default parameter
filter, and string paths of parameter-tree leaves.

The quantized linear keeps Flax's kernel layout [in, out] and quantizes it
along `in` (axis 0, the GEMM's reduction axis) with RTN double-block NVFP4
(docs/SPEC.md section 1). `NVFP4WeightQuantizer` is that quantizer, plus the latent
value w / s (s = s_in * s_out, the element's scale) that the memory-lean
variant and the diagnostics need. In an OutControl layer the forward
quantizes only the FP4 rows, gathered in the layer's FP4 order; given those
rows (`rows=`), the quantizer calls the layer's own weight quantization
(`tetrajet_jax.linear.fp4_weight_values`), so its blocks are the forward's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from tetrajet_jax.linear.layer import fp4_weight_values
from tetrajet_jax.numerics import dequantize_nvfp4, quantize_nvfp4
from tetrajet_jax.numerics.e2m1 import flush_subnormal
from tetrajet_jax.numerics.scales import reciprocal_rn
from tetrajet_jax.tree_paths import key_to_str

Path = tuple[str, ...]
ParamFilter = Callable[[Path, Any], bool]
Quantizer = Callable[..., jax.Array]


@dataclasses.dataclass(frozen=True, kw_only=True)
class NVFP4WeightQuantizer:
  """RTN double-block NVFP4 of a weight along `axis`, dequantized to float32.

  `q(w) == dequantize_nvfp4(quantize_nvfp4(w, axis=axis))`, the values the
  forward GEMM multiplies. Lengths along `axis` that are not a multiple of 128
  are zero-padded by the quantizer, as in the forward.

  Every method takes `rows`: None, or int32 [K'] row indices of a 2-D
  [in, out] kernel (axis 0) in the order an OutControl layer's FP4 part
  gathers them. Then only those rows are quantized, in that order (the
  forward's blocks); other rows get 0 from `__call__` and scale 1.
  """

  axis: int = 0

  def _check_rows(self, w, rows) -> None:
    if rows is not None and (self.axis != 0 or jnp.ndim(w) != 2):
      raise ValueError(f"NVFP4WeightQuantizer: rows= needs a 2-D [in, out] kernel quantized along axis 0; "
                       f"got axis {self.axis}, shape {jnp.shape(w)}.")

  def __call__(self, w: jax.typing.ArrayLike, rows: jax.Array | None = None) -> jax.Array:
    self._check_rows(w, rows)
    if rows is not None:
      return fp4_weight_values(jnp.asarray(w, jnp.float32), rows)
    return dequantize_nvfp4(quantize_nvfp4(w, axis=self.axis))

  def scale(self, w: jax.typing.ArrayLike, rows: jax.Array | None = None) -> jax.Array:
    """Each element's scale s = fp32(s_in * s_out) (float32, w's shape), as the quantizer computes it."""
    self._check_rows(w, rows)
    w = jnp.asarray(w, jnp.float32)
    if rows is not None:
      return jnp.ones(w.shape, jnp.float32).at[rows].set(self.scale(w[rows]))
    t = quantize_nvfp4(w, axis=self.axis)
    s_out = jnp.repeat(t.scale_outer, 8, axis=-1)  # [..., Kp/16]
    s = jnp.repeat(t.scale_inner.astype(jnp.float32) * s_out, 16, axis=-1)  # [..., Kp] canonical
    k = w.shape[t.axis]
    return jnp.moveaxis(s[..., :k], -1, t.axis)  # w's layout

  def latent(self, w: jax.typing.ArrayLike, rows: jax.Array | None = None) -> jax.Array:
    """w in grid units (float32, w's shape): w r with r = fp32(1 / s) of its block.

    The quantizer's own element rule (docs/SPEC.md section 1: subnormals
    flushed, then multiplied by the block's correctly rounded reciprocal), so
    `round_e2m1_nearest(latent(w))` reproduces the forward's codes bitwise.
    """
    w = jnp.asarray(w, jnp.float32)
    return jnp.sign(w) * flush_subnormal(jnp.abs(w)) * reciprocal_rn(self.scale(w, rows))

  def edge_distance(self, w: jax.typing.ArrayLike, rows: jax.Array | None = None) -> jax.Array:
    """Distance of each element to its nearest RTN decision threshold, in units of the local grid gap.

    0 on a threshold (the midpoint between two E2M1 neighbours), 0.5 on a grid
    value; beyond the saturation value 6 it keeps growing. This is the
    memory-lean variant's score (docs/SPEC.md section 3: |w/s - q| / bin width, measured from
    the decision edge): small means one small step flips Q(w).
    """
    return e2m1_edge_distance(self.latent(w, rows))


def e2m1_edge_distance(v: jax.Array) -> jax.Array:
  """|v - m| / g for the E2M1 interval [lo, lo + g] holding |v|, m its midpoint (float32)."""
  a = jnp.abs(jnp.asarray(v, jnp.float32))
  # Grid gaps are 0.5 on [0, 2), 1 on [2, 4), 2 on [4, 6]; saturated |v| > 6 measures from 5.
  gap = jnp.where(a < 2.0, 0.5, jnp.where(a < 4.0, 1.0, 2.0))
  lo = jnp.where(a < 2.0, jnp.floor(a * 2.0) * 0.5, jnp.where(a < 4.0, jnp.floor(a), 4.0))
  return jnp.abs(a - (lo + 0.5 * gap)) / gap


def default_param_filter(path: Path, leaf: Any) -> bool:
  """The kernels of the quantized linears: 2-D leaves named 'kernel', outside embeddings and the LM head.

  Norm scales (1-D), biases (1-D, named 'bias'), the embedding table (path
  holds 'embed') and the LM head (path holds 'lm_head') stay out. Models that
  keep other 2-D 'kernel' leaves in high precision need an exact filter.
  """
  return (getattr(leaf, "ndim", None) == 2 and len(path) > 0 and path[-1] == "kernel"
          and not any("embed" in k or "lm_head" in k for k in path))


def leaves_with_paths(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> dict[Path, Any]:
  """{path (tuple of str): leaf} in flatten order."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
  out: dict[Path, Any] = {}
  for kp, leaf in flat:
    path = tuple(key_to_str(k) for k in kp)
    if path in out:
      raise ValueError(f"Two leaves share the path {'/'.join(path)!r}; give them distinct keys.")
    out[path] = leaf
  return out


def nest(items: dict[Path, Any]) -> dict[str, Any]:
  """Nested dict from {path: value} (the inverse of leaves_with_paths on nested dicts)."""
  root: dict[str, Any] = {}
  for path, value in items.items():
    node = root
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = value
  return root


def path_name(path: Path) -> str:
  return "/".join(path)
