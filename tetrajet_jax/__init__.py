"""tetrajet-jax: fully quantized NVFP4 training (TetraJet-v2) in JAX.

Public surface; everything else may move. Layers, bottom to top:
numerics (formats, quantizers, RHT) -> linear (custom_vjp layer, recipes) ->
nn (Flax) / optim (OsciReset) -> model, data, train -> experiments.
"""

from tetrajet_jax.numerics import (MXFP8Tensor, NonFiniteError, NVFP4Tensor, check_numerics, dequantize,
                                   inverse_random_hadamard_16, quantize_mxfp8, quantize_nvfp4,
                                   random_hadamard_16)

__all__ = [
    "MXFP8Tensor", "NVFP4Tensor", "NonFiniteError", "check_numerics", "dequantize",
    "inverse_random_hadamard_16", "quantize_mxfp8", "quantize_nvfp4", "random_hadamard_16",
]
