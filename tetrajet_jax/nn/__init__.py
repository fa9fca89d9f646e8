"""Flax (NNX) layers built on the quantized linear."""

from tetrajet_jax.nn.quant_linear import (OUTCONTROL_PHASES, OutControlChannels, OutControlStats, QuantKeyState,
                                          QuantLinear, freeze_outlier_channels, iter_quant_linears,
                                          outlier_channels_tree, outlier_fractions, quantize_linears,
                                          quantized_kernel_filter, reset_outlier_stats, set_outcontrol_phase,
                                          stream_key)
