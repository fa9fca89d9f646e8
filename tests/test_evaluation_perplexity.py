"""Validation loss / perplexity / bits per byte."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tetrajet_jax.data import pipeline
from tetrajet_jax.evaluation import evaluate_perplexity

V = 50


def _val_batches(n_tokens=16 * 7 + 3, seq_len=16, batch=4):
  tokens = (np.arange(n_tokens) * 7 % V).astype(np.uint16)
  return tokens, list(pipeline.make_val_dataset(tokens, seq_len=seq_len, batch_size=batch,
                                                shard_index=0, shard_count=1))


def test_uniform_model_has_perplexity_v_and_exact_bits_per_byte():
  tokens, batches = _val_batches()
  token_bytes = np.arange(V) % 4  # some ids count 0 bytes, like EOS
  uniform = jax.jit(lambda t: jnp.zeros(t.shape + (V,), jnp.float32))
  out = evaluate_perplexity(uniform, batches, token_bytes=token_bytes)
  assert out["tokens"] == tokens.size - 1
  assert out["loss"] == pytest.approx(math.log(V), rel=1e-6)
  assert out["ppl"] == pytest.approx(V, rel=1e-5)
  n_bytes = token_bytes[tokens[1:]].sum()
  assert out["bytes"] == n_bytes
  assert out["bits_per_byte"] == pytest.approx(math.log2(V) * (tokens.size - 1) / n_bytes, rel=1e-5)


def test_perfect_model_has_zero_loss_and_padded_vocab_is_fine():
  tokens, batches = _val_batches()
  step = {int(a): int(b) for a, b in zip(tokens[:-1], tokens[1:])}  # deterministic successor
  table = np.zeros((V + 14, V + 14), np.float32)
  for a, b in step.items():
    table[a, b] = 100.0
  perfect = jax.jit(lambda t: jnp.asarray(table)[t])
  out = evaluate_perplexity(perfect, batches, token_bytes=np.ones(V))
  assert out["loss"] < 1e-6 and out["ppl"] == pytest.approx(1.0)


def test_missing_bytes_gives_nan_and_empty_input_raises():
  _, batches = _val_batches()
  uniform = lambda t: jnp.zeros(t.shape + (V,))
  assert math.isnan(evaluate_perplexity(uniform, batches, max_batches=1)["bits_per_byte"])
  with pytest.raises(ValueError, match="no validation tokens"):
    evaluate_perplexity(uniform, [])


def test_groups_report_each_group_and_overall_from_summed_sums():
  from tetrajet_jax.evaluation import perplexity  # pylint: disable=import-outside-toplevel

  _, prose = _val_batches(n_tokens=16 * 5 + 1)
  _, code = _val_batches(n_tokens=16 * 3 + 9)
  token_bytes = np.arange(V) % 5
  # A model that is sure of token 3: its loss differs per group with the
  # groups' token mix, so "overall" must weight them by tokens.
  logits = np.zeros(V, np.float32)
  logits[3] = 4.0
  model = jax.jit(lambda t: jnp.broadcast_to(jnp.asarray(logits), t.shape + (V,)))
  got = perplexity.evaluate_perplexity_groups(model, {"prose": prose, "code": code},
                                              token_bytes=token_bytes)
  each = {g: evaluate_perplexity(model, b, token_bytes=token_bytes)
          for g, b in (("prose", prose), ("code", code))}
  assert set(got) == {"prose", "code", "overall"}
  for g in ("prose", "code"):
    assert got[g]["loss"] == pytest.approx(each[g]["loss"], rel=1e-6)
  tokens = each["prose"]["tokens"] + each["code"]["tokens"]
  n_bytes = each["prose"]["bytes"] + each["code"]["bytes"]
  nll = each["prose"]["loss"] * each["prose"]["tokens"] + each["code"]["loss"] * each["code"]["tokens"]
  assert got["overall"]["tokens"] == tokens and got["overall"]["bytes"] == n_bytes
  assert got["overall"]["loss"] == pytest.approx(nll / tokens, rel=1e-6)
  assert got["overall"]["bits_per_byte"] == pytest.approx(nll / math.log(2) / n_bytes, rel=1e-6)
  assert each["prose"]["loss"] != pytest.approx(each["code"]["loss"])  # the weighting matters
  flat = perplexity.flatten_group_metrics(got)
  assert flat["val/loss"] == got["overall"]["loss"]
  assert flat["val/code/bits_per_byte"] == got["code"]["bits_per_byte"]


def test_summarize_groups_rejects_bad_input():
  from tetrajet_jax.evaluation import perplexity  # pylint: disable=import-outside-toplevel

  with pytest.raises(ValueError, match="group names"):
    perplexity.summarize_groups({}, has_bytes=True)
  with pytest.raises(ValueError, match="group names"):
    perplexity.summarize_groups({"overall": (1.0, 1.0, 1.0)}, has_bytes=True)
  out = perplexity.summarize_groups({"prose": (2.0, 4.0, 8.0), "code": (0.0, 0.0, 0.0)}, has_bytes=True)
  assert set(out) == {"prose", "overall"} and out["overall"]["loss"] == 0.5
