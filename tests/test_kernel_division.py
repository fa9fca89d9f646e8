"""The kernels' per-block division (kernels._division): the IEEE float32 quotient, bit for bit.

On the GPU each quotient is one PTX instruction (div.rn.ftz / rcp.rn.ftz) inside a Mosaic GPU
kernel; in the interpreter it is XLA's own correctly rounded division. Both are checked against
numpy's IEEE division with the flush of subnormal operands and results that the scale
arithmetic uses everywhere (docs/SPEC.md section 1).
"""

from __future__ import annotations

import functools

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
import pytest

from tetrajet_jax.kernels import _platform
from tetrajet_jax.kernels._division import div_rn, reciprocal_rn
from tetrajet_jax.numerics.scales import E4M3_MAX

ROWS = 64 * 16  # 16 tiles of 64 rows (all in SMEM at once)
TINY = np.finfo(np.float32).tiny


def _flush(v: np.ndarray) -> np.ndarray:
  return np.where(np.abs(v) < TINY, np.float32(0) * v, v).astype(np.float32)


def _ieee_quotient(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  with np.errstate(all="ignore"):
    return _flush(_flush(x) / _flush(y))


def _per_row(op, *rows: jax.Array, interpret: bool) -> jax.Array:
  """Runs op on ROWS f32 values, 64 at a time in the wgmma row layout (the quantizers' scales).

  Each operand arrives as [ROWS, 8] whose eight columns repeat the value, and the row max of a
  [64, 8] tile makes a per-row array in that layout."""
  tiles = [jnp.broadcast_to(r.reshape(-1, 1), (ROWS, 8)) for r in rows]

  n = len(tiles)

  def kernel(*refs):
    in_gmem, out_gmem = refs[:n], refs[n]
    in_smem, out_smem, barriers = refs[n + 1:2 * n + 1], refs[2 * n + 1], refs[2 * n + 2:]
    for src, dst, bar in zip(in_gmem, in_smem, barriers):
      plgpu.copy_gmem_to_smem(src, dst, bar)
    for bar in barriers:
      plgpu.barrier_wait(bar)
    for t in range(ROWS // 64):
      rows_t = pl.ds(t * 64, 64)
      vals = [jnp.max(plgpu.load(ref.at[rows_t, :], layout=plgpu.Layout.WGMMA), axis=1) for ref in in_smem]
      out_smem[rows_t] = op(*vals)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, out_gmem)
    plgpu.wait_smem_to_gmem(0)

  call = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((ROWS,), jnp.float32),
                      scratch_types=[plgpu.SMEM((ROWS, 8), jnp.float32) for _ in tiles]
                      + [plgpu.SMEM((ROWS,), jnp.float32)] + [plgpu.Barrier() for _ in tiles])
  with _platform.interpret_context(interpret):
    return jax.jit(call)(*tiles)


def _operands(rng) -> tuple[np.ndarray, np.ndarray]:
  """Positive dividends and divisors over the scale range, plus ties, a / a and the binade
  edges; the divisors stay positive normal (the quantizers' scales)."""
  n = ROWS - 8
  x = np.exp2(rng.uniform(-126, 127, n)).astype(np.float32)
  y = np.exp2(rng.uniform(-60, 60, n)).astype(np.float32)
  a = (rng.uniform(1, 2, 8) * np.exp2(rng.integers(-20, 20, 8))).astype(np.float32)
  x[: n // 4] = rng.integers(1, 2**12, n // 4).astype(np.float32) * 3  # exact quotients and halves
  y[: n // 4] = 2 * rng.integers(1, 2**12, n // 4).astype(np.float32)
  x = np.concatenate([x, [4.6875, 0.0, 1e-40, np.inf, np.nan, a[0], 2.0**-120, 3e38]]).astype(np.float32)
  y = np.concatenate([y, [0.9375, 3.0, 7.0, 2.0, 1.5, a[0], 1e10, 2.0**-3]]).astype(np.float32)
  return x, y


def _cases(rng, interpret: bool):
  x, y = _operands(rng)
  yield "x / y", _per_row(functools.partial(div_rn, interpret=interpret), x, y, interpret=interpret), \
      _ieee_quotient(x, y)
  for c in (E4M3_MAX, 6.0):
    yield f"x / {c}", _per_row(lambda v, c=c: div_rn(v, c, interpret=interpret), x, interpret=interpret), \
        _ieee_quotient(x, np.full_like(x, c))
  s = np.abs(y)
  with np.errstate(all="ignore"):
    want_r = np.where(s < TINY, np.float32(np.inf), _flush(np.float32(1) / s)).astype(np.float32)
  yield "1 / s", _per_row(lambda v: reciprocal_rn(v, interpret=interpret), s, interpret=interpret), want_r


def _check(rng, interpret: bool):
  for name, got, want in _cases(rng, interpret):
    got = np.asarray(got)
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    assert not bad.any(), (f"{name}: {bad.sum()} quotients differ from IEEE, e.g. "
                           f"{list(zip(got[bad][:4], want[bad][:4]))}")


def test_division_interpret(rng):
  _check(rng, interpret=True)


@pytest.mark.gpu
def test_division_gpu(rng):
  """div.rn.ftz.f32 and rcp.rn.ftz.f32 in a Mosaic GPU kernel: the IEEE quotient."""
  _check(rng, interpret=False)
