"""Validation passes: the val split, or each source group's held-out documents on its own.

`score_batches` runs the jitted eval step over one stream's batches and keeps
the sums and each batch's mean loss (the demo's paired bootstrap needs them);
`summarize` turns the streams' sums into the reported figures: loss,
perplexity and bits per byte overall, plus ``<group>/...`` per source group.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax

from tetrajet_jax.evaluation.perplexity import OVERALL, summarize_groups, summarize_perplexity
from tetrajet_jax.train import sharding as sharding_lib

BATCH_KEYS = ("inputs", "targets", "weights")


def score_batches(eval_fn: Callable, params: Any, model_vars: Any, batches: Iterable[dict], token_bytes: jax.Array,
                  mesh: jax.sharding.Mesh, max_batches: int | None) -> tuple[float, float, float, list, list]:
  """(nll sum, tokens, bytes, per-batch mean losses, per-batch tokens) of one stream's batches."""
  nll_sum, n_tok, n_bytes, losses, counts = 0.0, 0.0, 0.0, [], []
  for i, local in enumerate(batches):
    if max_batches is not None and i >= max_batches:
      break
    batch = sharding_lib.global_batch({k: local[k] for k in BATCH_KEYS}, mesh)
    nll, count, nb = (float(x) for x in eval_fn(params, model_vars, batch, token_bytes))
    nll_sum, n_tok, n_bytes = nll_sum + nll, n_tok + count, n_bytes + nb
    if count > 0:
      losses.append(nll / count)
      counts.append(count)
  return nll_sum, n_tok, n_bytes, losses, counts


def summarize(scored: dict[str, tuple], *, grouped: bool, has_bytes: bool) -> dict[str, Any]:
  """The figures of `score_batches` results per stream: a single stream is the val split;
  ``grouped`` streams are source groups, reported as ``<group>/<metric>`` beside the overall
  figures of their summed counts. ``batch_losses``/``batch_tokens`` list every stream's batches."""
  sums = {g: r[:3] for g, r in scored.items()}
  if grouped:
    groups = summarize_groups(sums, has_bytes=has_bytes)
    out = dict(groups.pop(OVERALL))
    for group, metrics in groups.items():
      out.update({f"{group}/{k}": v for k, v in metrics.items()})
  else:
    (only,) = sums.values()
    out = summarize_perplexity(*only, has_bytes=has_bytes)
  out["batch_losses"] = [x for r in scored.values() for x in r[3]]
  out["batch_tokens"] = [x for r in scored.values() for x in r[4]]
  return out
