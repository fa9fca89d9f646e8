"""Optimizer-side pieces: the OsciReset transformation and oscillation diagnostics."""

from tetrajet_jax.optim.diagnostics import latent_weight_histogram, oscillation_fraction, weight_change_rates
from tetrajet_jax.optim.osci_reset import (WINDOW_PHASES, OsciResetState, find_osci_reset_state, is_layer_metric,
                                          osci_reset, osci_reset_metrics, window_phase_of)
from tetrajet_jax.optim.weight_quantizer import NVFP4WeightQuantizer, default_param_filter, e2m1_edge_distance

__all__ = [
    "NVFP4WeightQuantizer",
    "WINDOW_PHASES",
    "OsciResetState",
    "default_param_filter",
    "e2m1_edge_distance",
    "find_osci_reset_state",
    "is_layer_metric",
    "latent_weight_histogram",
    "osci_reset",
    "osci_reset_metrics",
    "oscillation_fraction",
    "weight_change_rates",
    "window_phase_of",
]
