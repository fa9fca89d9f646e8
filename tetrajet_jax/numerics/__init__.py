"""Numerics core: element and scale formats, NVFP4/MXFP8 quantizers, RHT-16."""

from tetrajet_jax.numerics import counter_rng
from tetrajet_jax.numerics.checks import NonFiniteError, check_numerics
from tetrajet_jax.numerics.e2m1 import (E2M1_GRID, E2M1_MAX, decode_e2m1, pack_e2m1, round_e2m1_nearest,
                                        round_e2m1_stochastic, unpack_e2m1)
from tetrajet_jax.numerics.hadamard import hadamard_signs, inverse_random_hadamard_16, random_hadamard_16
from tetrajet_jax.numerics.mxfp8 import (MXFP8Tensor, dequantize_mxfp8, dequantize_mxfp8_canonical,
                                         mxfp8_values, quantize_mxfp8)
from tetrajet_jax.numerics.nvfp4 import (NVFP4Operand, NVFP4Tensor, dequantize_nvfp4, dequantize_nvfp4_canonical,
                                         nvfp4_bf16_operand, quantize_nvfp4, tensor_outer_scale)
from tetrajet_jax.numerics.scales import div_rn, e8m0_exponent, round_to_e4m3


def dequantize(t):
  """float32 values of any quantized tensor (NVFP4Tensor or MXFP8Tensor), original shape."""
  if isinstance(t, NVFP4Tensor):
    return dequantize_nvfp4(t)
  if isinstance(t, MXFP8Tensor):
    return dequantize_mxfp8(t)
  raise TypeError(f"dequantize: expected NVFP4Tensor or MXFP8Tensor, got {type(t).__name__}.")
