"""OLMo-2 style decoder (Flax NNX) and its configs."""

from tetrajet_jax.model.configs import CONFIGS, ModelConfig, get_config
from tetrajet_jax.model.olmo2 import OLMo2, RMSNorm, causal_attention, lm_loss, rope, truncated_normal_init

__all__ = ["CONFIGS", "ModelConfig", "OLMo2", "RMSNorm", "causal_attention",
           "get_config", "lm_loss", "rope", "truncated_normal_init"]
