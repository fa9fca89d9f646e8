"""Validation loss, perplexity and bits per byte for any logits function.

Bits per byte divides the summed negative log-likelihood (in bits) by the
UTF-8 bytes the scored targets stand for, so runs with different tokenizers
compare. With a byte-level tokenizer each id covers a fixed number of bytes
(`Tokenizer.token_byte_lengths`), which makes the byte count exact for any
subset of batches, special tokens (EOS) counting zero bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

LogitsFn = Callable[[jax.Array], jax.Array]


@jax.jit
def batch_stats(
    logits: jax.Array, targets: jax.Array, weights: jax.Array, token_bytes: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(summed weighted NLL, summed weights, summed target bytes) of one batch
  (also inside the trainer's sharded eval step)."""
  logp_BxTxV = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  target_logp_BxT = jnp.take_along_axis(logp_BxTxV, targets[..., None], axis=-1)[..., 0]
  nll = -(target_logp_BxT * weights).sum()
  n_bytes = (token_bytes[targets] * weights).sum()
  return nll, weights.sum(), n_bytes


def padded_token_bytes(token_bytes: np.ndarray | None, vocab: int) -> np.ndarray:
  """float32 [vocab] bytes per id; ids beyond the tokenizer's (a padded model
  vocabulary) and ``token_bytes=None`` count zero bytes."""
  tb = np.zeros(vocab, np.float32)
  if token_bytes is not None:
    if len(token_bytes) > vocab:
      raise ValueError(f"model vocab {vocab} < tokenizer vocab {len(token_bytes)}")
    tb[: len(token_bytes)] = token_bytes
  return tb


def evaluate_perplexity(
    logits_fn: LogitsFn,
    batches: Iterable[Mapping[str, np.ndarray]],
    *,
    token_bytes: np.ndarray | None = None,
    max_batches: int | None = None,
) -> dict[str, float]:
  """Mean next-token loss over validation batches.

  Args:
    logits_fn: ``tokens int32[B, T] -> float[B, T, V]`` (e.g. a jitted apply).
    batches: dicts with ``inputs``/``targets`` int32[B, T] and optional
      ``weights`` float[B, T] (as from `make_val_dataset`).
    token_bytes: int[V'] bytes per id (``tokenizer.token_byte_lengths()``);
      ``None`` leaves ``bits_per_byte`` as NaN. Padded model vocabularies
      (V > V') are fine: the extra ids count zero bytes.
    max_batches: stop after this many batches.

  Returns:
    ``{"loss": nats/token, "ppl": exp(loss), "bits_per_byte", "tokens",
    "bytes"}``.

  Raises:
    ValueError: no batch held any weighted target.
  """
  sums = accumulate_sums(logits_fn, batches, token_bytes=token_bytes, max_batches=max_batches)
  return summarize_perplexity(*sums, has_bytes=token_bytes is not None)


Sums = tuple[float, float, float]  # (summed NLL in nats, scored tokens, their UTF-8 bytes)


def accumulate_sums(
    logits_fn: LogitsFn,
    batches: Iterable[Mapping[str, np.ndarray]],
    *,
    token_bytes: np.ndarray | None = None,
    max_batches: int | None = None,
) -> Sums:
  """``(nll_sum, tokens, bytes)`` over batches (see `evaluate_perplexity`)."""
  nll_sum, n_tok, n_bytes = 0.0, 0.0, 0.0
  tb = None
  for i, batch in enumerate(batches):
    if max_batches is not None and i >= max_batches:
      break
    inputs = jnp.asarray(batch["inputs"], jnp.int32)
    targets = jnp.asarray(batch["targets"], jnp.int32)
    weights = jnp.asarray(batch.get("weights", np.ones(targets.shape, np.float32)), jnp.float32)
    logits = logits_fn(inputs)
    if logits.shape[:2] != targets.shape:
      raise ValueError(f"logits_fn returned {logits.shape}, expected {targets.shape} + (vocab,)")
    if tb is None:
      tb = jnp.asarray(padded_token_bytes(token_bytes, logits.shape[-1]))
    nll, count, nb = batch_stats(logits, targets, weights, tb)
    nll_sum += float(nll)
    n_tok += float(count)
    n_bytes += float(nb)
  return nll_sum, n_tok, n_bytes


def summarize_perplexity(nll_sum: float, n_tok: float, n_bytes: float, *, has_bytes: bool) -> dict[str, float]:
  """Loss, perplexity and bits per byte from accumulated sums (shared with the trainer's sharded eval).

  Raises:
    ValueError: no token was scored.
  """
  if n_tok == 0:
    raise ValueError("no validation tokens were scored: the batches were empty or all weights 0; "
                     "check the val split (`python -m tetrajet_jax.data.build`).")
  loss = nll_sum / n_tok
  bpb = nll_sum / (math.log(2) * n_bytes) if has_bytes and n_bytes > 0 else math.nan
  return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "bits_per_byte": bpb,
          "tokens": n_tok, "bytes": n_bytes}


OVERALL = "overall"


def summarize_groups(sums: Mapping[str, Sums], *, has_bytes: bool) -> dict[str, dict[str, float]]:
  """Metrics of each source group (``prose``, ``code``) and ``overall``.

  ``overall`` adds the groups' sums, so it is the token-weighted loss and the
  byte-weighted bits per byte of all groups together (the whole validation
  set when ``sums`` covers every group).

  Raises:
    ValueError: ``sums`` is empty, a group is named ``overall``, or no token
      was scored at all. A group with no scored token is left out.
  """
  if not sums or OVERALL in sums:
    raise ValueError(f"sums must map group names (not {OVERALL!r}) to (nll, tokens, bytes); "
                     f"got {sorted(sums)}.")
  total = tuple(float(sum(s[i] for s in sums.values())) for i in range(3))
  out = {g: summarize_perplexity(*s, has_bytes=has_bytes) for g, s in sorted(sums.items()) if s[1] > 0}
  out[OVERALL] = summarize_perplexity(*total, has_bytes=has_bytes)
  return out


def evaluate_perplexity_groups(
    logits_fn: LogitsFn,
    group_batches: Mapping[str, Iterable[Mapping[str, np.ndarray]]],
    *,
    token_bytes: np.ndarray | None = None,
    max_batches: int | None = None,
) -> dict[str, dict[str, float]]:
  """`evaluate_perplexity` per source group, plus ``overall`` (see `summarize_groups`).

  Args:
    logits_fn: as for `evaluate_perplexity`.
    group_batches: group name -> its validation batches (e.g.
      ``make_val_dataset(data.val_group_paths()[g], ...)``).
    token_bytes: as for `evaluate_perplexity`.
    max_batches: per group.
  """
  sums = {g: accumulate_sums(logits_fn, b, token_bytes=token_bytes, max_batches=max_batches)
          for g, b in group_batches.items()}
  return summarize_groups(sums, has_bytes=token_bytes is not None)


def flatten_group_metrics(metrics: Mapping[str, Mapping[str, float]], prefix: str = "val"
                          ) -> dict[str, float]:
  """``{"val/loss": overall loss, "val/prose/loss": ..., "val/code/bits_per_byte": ...}``
  for loggers that take flat scalar names."""
  flat = {}
  for group, values in metrics.items():
    head = prefix if group == OVERALL else f"{prefix}/{group}"
    flat.update({f"{head}/{k}": float(v) for k, v in values.items()})
  return flat
