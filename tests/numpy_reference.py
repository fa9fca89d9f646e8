"""Independent NumPy / ml_dtypes reference of the spec's formats.

Written from shared/spec/TETRAJET_V2.md, not from the code under test: element
and scale rounding use ml_dtypes casts (float4_e2m1fn, float8_e4m3fn), block
logic is plain NumPy in float32 (float64 where a claim is about exact math).
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


def nvfp4_block(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Double-block NVFP4 of x along its last axis (length multiple of 128).

  Returns (codes [..., K] uint8, s_in [..., K/16] f32, s_out [..., K/128] f32).
  """
  x = np.asarray(x, F32)
  *lead, k = x.shape
  xb = x.reshape(*lead, k // 128, 128)
  amax = np.abs(xb).max(-1)
  s_out = (amax / F32(448)) / F32(6)
  s_out = np.where(s_out == 0, F32(1), s_out).astype(F32)
  amax16 = np.abs(x.reshape(*lead, k // 16, 16)).max(-1)
  s_out16 = np.repeat(s_out, 8, -1)
  s_in = e4m3((amax16 / s_out16) / F32(6))
  s_in = np.where(s_in == 0, F32(2.0**-9), s_in).astype(F32)
  s = np.repeat((s_in * s_out16).astype(F32), 16, -1)
  codes = e2m1_codes(x / s)
  return codes, s_in, s_out


def nvfp4_tensor(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """NVIDIA per-tensor NVFP4 along the last axis (length multiple of 16)."""
  x = np.asarray(x, F32)
  *lead, k = x.shape
  s_out = np.abs(x).max() / F32(448 * 6)
  s_out = F32(1) if s_out == 0 else F32(s_out)
  amax16 = np.abs(x.reshape(*lead, k // 16, 16)).max(-1)
  s_in = e4m3((amax16 / s_out) / F32(6))
  s_in = np.where(s_in == 0, F32(2.0**-9), s_in).astype(F32)
  s = np.repeat((s_in * s_out).astype(F32), 16, -1)
  return e2m1_codes(x / s), s_in, np.asarray(s_out, F32)


def nvfp4_tensor_2d(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per-tensor NVFP4 with 16x16 inner blocks; x [R, K], both multiples of 16."""
  x = np.asarray(x, F32)
  r, k = x.shape
  s_out = np.abs(x).max() / F32(448 * 6)
  s_out = F32(1) if s_out == 0 else F32(s_out)
  amax = np.abs(x.reshape(r // 16, 16, k // 16, 16)).max((1, 3))
  s_in = e4m3((amax / s_out) / F32(6))
  s_in = np.where(s_in == 0, F32(2.0**-9), s_in).astype(F32)
  s = np.repeat(np.repeat((s_in * s_out).astype(F32), 16, 0), 16, 1)
  return e2m1_codes(x / s), s_in, np.asarray(s_out, F32)


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
