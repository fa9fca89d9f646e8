"""tetrajet-jax: fully quantized NVFP4 training (TetraJet-v2) in JAX.

Public surface; everything else may move. Layers, bottom to top:
  numerics (formats, quantizers, RHT)
  -> kernels (Pallas fused quantizers and the NVFP4 GEMM for Hopper)
  -> linear (custom_vjp quantized linear, recipes, backends: GEMM execution)
  -> nn (Flax NNX layers) / optim (OsciReset)
  -> model, data, evaluation, train
  -> experiments (ablation runner, report, benchmarks; outside the package)
"""

from tetrajet_jax.data import Tokenizer, locate_data
from tetrajet_jax.evaluation import TaskResult, evaluate_downstream, evaluate_perplexity
from tetrajet_jax.linear import BackendUnavailableError, Recipe, linear, recipes
from tetrajet_jax.nn import QuantLinear, freeze_outlier_channels, quantize_linears, set_outcontrol_phase
from tetrajet_jax.optim import (OsciResetState, latent_weight_histogram, osci_reset, osci_reset_metrics,
                                oscillation_fraction, weight_change_rates)
from tetrajet_jax.numerics import (MXFP8Tensor, NonFiniteError, NVFP4Tensor, check_numerics, dequantize,
                                   inverse_random_hadamard_16, quantize_mxfp8, quantize_nvfp4,
                                   random_hadamard_16)



def __getattr__(name: str):
  # The grain pipeline loads on first use, so `python -m tetrajet_jax.data.unpack`
  # (and the corpus builder) run where grain is not installed yet.
  if name in ("make_train_dataset", "make_val_dataset"):
    import tetrajet_jax.data  # pylint: disable=import-outside-toplevel

    return getattr(tetrajet_jax.data, name)
  raise AttributeError(f"module 'tetrajet_jax' has no attribute {name!r}")


__all__ = [
    "BackendUnavailableError", "MXFP8Tensor", "NVFP4Tensor", "NonFiniteError", "OsciResetState", "QuantLinear", "Recipe", "TaskResult",
    "Tokenizer", "check_numerics", "dequantize", "evaluate_downstream", "evaluate_perplexity",
    "freeze_outlier_channels", "inverse_random_hadamard_16", "latent_weight_histogram", "linear",
    "locate_data", "make_train_dataset", "make_val_dataset", "osci_reset", "osci_reset_metrics",
    "oscillation_fraction", "quantize_linears", "quantize_mxfp8", "quantize_nvfp4", "random_hadamard_16",
    "recipes", "set_outcontrol_phase", "weight_change_rates",
]
