"""Independent NumPy / ml_dtypes reference of the spec's formats.

Written from the method's specification (docs/SPEC.md section 1), not from the
code under test: element and scale rounding use ml_dtypes casts
(float4_e2m1fn, float8_e4m3fn), block logic is plain NumPy in float32 (numpy's
float32 division and multiplication are IEEE correctly rounded: the element
rule's r = fp32(1 / s) and v = fp32(x r) are written that way), float64 where
a claim is about exact math. Stochastic rounding uses the documented
counter-based generator, re-implemented here in NumPy.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)


def e4m3(x) -> np.ndarray:
  """RNE to float8_e4m3fn, saturating (satfinite), as float32."""
  x = np.asarray(x, F32)
  return np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(F32)


def e2m1_codes(v) -> np.ndarray:
  """E2M1 codes (uint8) of v: RNE, saturate at 6, zero canonicalized to +0."""
  v = np.clip(np.asarray(v, F32), -6, 6)
  f4 = v.astype(ml_dtypes.float4_e2m1fn)
  codes = f4.view(np.uint8) & 0xF
  return np.where((codes & 0x7) == 0, 0, codes).astype(np.uint8)


def decode_codes(codes) -> np.ndarray:
  codes = np.asarray(codes, np.uint8)
  mag = E2M1_VALUES[codes & 0x7]
  return np.where(codes & 0x8, -mag, mag)


def unpack(packed) -> np.ndarray:
  packed = np.asarray(packed, np.uint8)
  return np.stack([packed & 0xF, packed >> 4], -1).reshape(*packed.shape[:-1], -1)


TINY = np.finfo(F32).tiny


def ftz(v) -> np.ndarray:
  """float32 v with subnormals flushed to 0: every backend (XLA's CPU flushes
  them in hardware) treats them so in the scale arithmetic and the elements."""
  v = np.asarray(v, F32)
  return np.where(np.abs(v) < TINY, F32(0), v).astype(F32)


def _div(a, b) -> np.ndarray:
  """IEEE float32 a / b (numpy's float32 division is correctly rounded), subnormals flushed."""
  with np.errstate(all="ignore"):
    return ftz(ftz(a) / ftz(b))


def _scales(amax16, s_out16):
  """s_in = e4m3(amax_16 / s_out / 6), 0 -> 2^-9 (float32)."""
  s_in = e4m3(_div(_div(amax16, s_out16), F32(6)))
  return np.where(s_in == 0, F32(2.0**-9), s_in).astype(F32)


def _outer(amax):
  """TetraJet-v2's s_out = amax / 448 / 6 (two divisions), 0 -> 1."""
  s = _div(_div(amax, F32(448)), F32(6))
  return np.where(s == 0, F32(1), s).astype(F32)


def _tensor_scale(amax):
  """NVIDIA's per-tensor s = amax / (448 * 6) (one division), 0 -> 1."""
  s = _div(amax, F32(448 * 6))
  return np.where(s == 0, F32(1), s).astype(F32)


def reciprocal(s) -> np.ndarray:
  """r = fp32(1 / s), correctly rounded (numpy float32 division); subnormals
  flushed: s below the normal range counts as 0 (r = inf), and so does an r
  below it (s > 2^126, beyond any scale of a finite input)."""
  with np.errstate(divide="ignore"):
    return ftz(F32(1) / ftz(s))


def scaled(x, s) -> np.ndarray:
  """v = fp32(x * r), r = fp32(1 / s): the element rule's one product per element."""
  with np.errstate(invalid="ignore", over="ignore"):
    return (ftz(x) * reciprocal(s)).astype(F32)


def fmix32(h) -> np.ndarray:
  """MurmurHash3's 32-bit finalizer, in uint64 with explicit wrapping."""
  h = np.asarray(h, np.uint64) & 0xFFFFFFFF
  h ^= h >> 16
  h = (h * 0x85EBCA6B) & 0xFFFFFFFF
  h ^= h >> 13
  h = (h * 0xC2B2AE35) & 0xFFFFFFFF
  return h ^ (h >> 16)


def counter_bits(seed: int, rows: int, k: int) -> np.ndarray:
  """The documented SR generator: uint64 [rows, k] in [0, 2^16), one hash per element pair."""
  r = np.arange(rows, dtype=np.uint64)
  row_key = fmix32((fmix32(np.uint64(seed) ^ 0x9E3779B9) + fmix32(r ^ 0x7F4A7C15)) & 0xFFFFFFFF)[:, None]
  pair = np.arange(k, dtype=np.uint64)[None, :] // 2
  h = fmix32((fmix32(row_key ^ ((pair * 0x9E3779B9) & 0xFFFFFFFF)) + row_key) & 0xFFFFFFFF)
  odd = (np.arange(k) % 2 == 1)[None, :]
  return np.where(odd, h >> 16, h & 0xFFFF)


def sr_codes(v, bits) -> np.ndarray:
  """E2M1 codes of v by stochastic rounding: with lo <= |v| < hi and
  p = (|v| - lo) / (hi - lo) in float64, step up iff (bits + 1/2) / 2^16 < p."""
  a = np.nan_to_num(np.minimum(np.abs(np.asarray(v, np.float64)), 6.0), nan=0.0)
  i = np.searchsorted(E2M1_VALUES, a, side="right") - 1
  j = np.minimum(i + 1, 7)
  gap = np.where(j > i, E2M1_VALUES[j] - E2M1_VALUES[i], np.inf)
  up = (np.asarray(bits, np.float64) + 0.5) / 2.0**16 < (a - E2M1_VALUES[i]) / gap
  idx = np.where(up, j, i).astype(np.uint8)
  return np.where(np.signbit(np.asarray(v, F32)) & (idx > 0), idx | 8, idx).astype(np.uint8)


def element_codes(x, s, seed=None) -> np.ndarray:
  """Codes of x with per-element scales s (same shape): RNE of v = fp32(x * fp32(1/s)),
  or stochastic rounding of v with counter_bits(seed) if a seed is given."""
  v = scaled(x, s)
  if seed is None:
    return e2m1_codes(np.nan_to_num(v, nan=0.0))
  *lead, k = v.shape
  bits = counter_bits(seed, int(np.prod(lead, dtype=np.int64)), k).reshape(v.shape)
  return sr_codes(v, bits)


def nvfp4_block(x, seed=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Double-block NVFP4 of x along its last axis (length multiple of 128);
  RTN, or stochastic rounding with the counter-based generator's seed.

  Returns (codes [..., K] uint8, s_in [..., K/16] f32, s_out [..., K/128] f32).
  """
  x = np.asarray(x, F32)
  *lead, k = x.shape
  ax = np.abs(x)
  with np.errstate(invalid="ignore"):
    amax = ax.reshape(*lead, k // 128, 128).max(-1)
    amax16 = ax.reshape(*lead, k // 16, 16).max(-1)
  s_out = _outer(amax)
  s_out = np.where(np.isfinite(amax), s_out, F32(np.nan)).astype(F32)
  s_out16 = np.repeat(s_out, 8, -1)
  s_in = _scales(amax16, s_out16)
  s = np.repeat((s_in * s_out16).astype(F32), 16, -1)
  return element_codes(x, s, seed), s_in, s_out


def nvfp4_tensor(x, seed=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """NVIDIA per-tensor NVFP4 along the last axis (length multiple of 16); RTN, or
  stochastic rounding with the counter-based generator's seed."""
  x = np.asarray(x, F32)
  *lead, k = x.shape
  s_out = _tensor_scale(np.abs(x).max())
  amax16 = np.abs(x.reshape(*lead, k // 16, 16)).max(-1)
  s_in = _scales(amax16, s_out)
  s = np.repeat((s_in * s_out).astype(F32), 16, -1)
  return element_codes(x, s, seed), s_in, np.asarray(s_out, F32)


def nvfp4_tensor_2d(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per-tensor NVFP4 with 16x16 inner blocks; x [R, K], both multiples of 16."""
  x = np.asarray(x, F32)
  r, k = x.shape
  s_out = _tensor_scale(np.abs(x).max())
  amax = np.abs(x.reshape(r // 16, 16, k // 16, 16)).max((1, 3))
  s_in = _scales(amax, s_out)
  s = np.repeat(np.repeat((s_in * s_out).astype(F32), 16, 0), 16, 1)
  return element_codes(x, s), s_in, np.asarray(s_out, F32)


def mxfp8(x) -> tuple[np.ndarray, np.ndarray]:
  """MXFP8 along the last axis (multiple of 32): (e4m3 values f32, exponent int)."""
  x = np.asarray(x, F32)
  *lead, k = x.shape
  xb = x.reshape(*lead, k // 32, 32).astype(np.float64)
  amax = np.abs(xb).max(-1)
  with np.errstate(divide="ignore"):
    e = np.where(amax > 0, np.ceil(np.log2(amax / 448.0)), 0).astype(np.int64)
  # log2 in float64 can be off by one ulp near powers of two: fix exactly.
  e = np.where(448.0 * np.exp2(e) < amax, e + 1, e)
  e = np.where((amax > 0) & (448.0 * np.exp2(e - 1) >= amax), e - 1, e)
  e = np.clip(e, -127, 127)
  data = e4m3((xb / np.exp2(e)[..., None]).astype(F32)).reshape(*lead, k)
  return data, e


def sylvester_hadamard(n: int) -> np.ndarray:
  h = np.array([[1.0]])
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h
