"""The quantized linear layer (custom_vjp), its recipes and GEMM execution."""

from tetrajet_jax.linear import recipes
from tetrajet_jax.linear.gemm import GEMM_MODES, gemm_nt
from tetrajet_jax.linear.linear import (ChannelSplit, channel_split, fp4_weight_values, linear, outlier_count,
                                        residual_bytes_per_token)
from tetrajet_jax.linear.recipes import QuantizerConfig, Recipe
