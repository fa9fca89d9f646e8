"""Pallas kernels for NVFP4 on Hopper (sm_90): fused RTN and backward (RHT-16 + SR) quantizers and
the exact GEMM (Mosaic GPU), and the two quantizers again as Pallas Triton kernels
(`nvfp4_quantize_triton`).

Each op sits beside its pure-JAX reference and a `can_use_*` check. The layer
picks them by the recipe's backend (tetrajet_jax.linear.gemm): "auto" falls
back to tetrajet_jax.numerics (XLA) where the check says no, "pallas" raises.
Kernel modules import only tetrajet_jax.numerics and jax.
"""

from tetrajet_jax.kernels import _lowering_cache  # noqa: F401  (installs the per-process Mosaic lowering cache)
from tetrajet_jax.kernels._platform import backward_operands, hopper_available, triton_quantizer
from tetrajet_jax.kernels.nvfp4_gemm import (GemmConfig, block_scaled_bf16_gemm, can_use_nvfp4_gemm, can_use_pallas_gemm,
                                       layer_gemm_config, nvfp4_gemm, nvfp4_gemm_reference, operand_rows_and_k)
from tetrajet_jax.kernels.nvfp4_quantize_backward import (can_use_pallas_backward_quantizer, quantize_nvfp4_backward,
                                                    quantize_nvfp4_backward_reference, transformed_amax)
from tetrajet_jax.kernels.nvfp4_quantize import (can_use_pallas_quantizer, quantize_nvfp4_rtn,
                                           quantize_nvfp4_rtn_reference)
from tetrajet_jax.kernels.nvfp4_quantize_triton import (can_use_triton_quantizer, quantize_nvfp4_backward_triton,
                                                  quantize_nvfp4_rtn_triton, requantize_nvfp4_backward_triton)
