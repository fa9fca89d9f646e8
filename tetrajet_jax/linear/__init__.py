"""The quantized linear layer (custom_vjp), its recipes and GEMM execution."""

from tetrajet_jax.linear import recipes
from tetrajet_jax.linear.gemm import BackendUnavailableError, gemm_nt, interpret_kernels
from tetrajet_jax.linear.layer import (ChannelSplit, channel_split, fp4_weight_values, linear, outlier_count,
                                       residual_bytes_per_token)
from tetrajet_jax.linear.recipes import BACKENDS, Backend, QuantizerConfig, Recipe
