"""Zero-shot downstream accuracy by log-likelihood ranking of choices.

For each question, every choice is scored as the log-likelihood of its
continuation tokens given ``[EOS] + context`` (EOS marks a document start,
as in training). Two scores are reported for every ranked task:

* ``acc``: argmax of the summed log-likelihood;
* ``acc_norm``: argmax of the log-likelihood per character of the
  continuation (lm-eval-harness's ``acc_norm``), which removes the bias
  towards short choices.

`TaskSpec.metric` names the headline one (see `data.eval_requests.TASKS`).
LAMBADA has a single continuation (the last word); it counts as correct when
every continuation token is the model's argmax (greedy) prediction; its
chance level is 0.

Ties (e.g. a uniform model) earn 1/k credit when the gold choice is among k
tied best choices, so a model that cannot tell choices apart scores chance
in expectation instead of "always the first choice".

Shapes are fixed: requests are sorted by length, cut into batches of
``batch_size`` rows and right-padded to the next length bucket (powers of
two up to ``max_len``), so a jitted ``logits_fn`` compiles once per bucket.
Contexts longer than the bucket are truncated on the left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tetrajet_jax.data import eval_requests
from tetrajet_jax.data.eval_requests import TASKS, TaskInstance, TaskSpec, load_task, task_spec
from tetrajet_jax.data.tokenizer import Tokenizer

LogitsFn = Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskResult:
  """Accuracy of one task.

  Attributes:
    task: task name.
    metric: which of acc/acc_norm/greedy ``accuracy`` is.
    accuracy: the headline accuracy in [0, 1].
    acc: summed log-likelihood ranking accuracy (greedy accuracy for LAMBADA).
    acc_norm: per-character normalised ranking accuracy.
    chance: expected accuracy of random guessing (mean of 1/num_choices).
    num_docs: questions scored.
  """

  task: str
  metric: str
  accuracy: float
  acc: float
  acc_norm: float
  chance: float
  num_docs: int


@dataclasses.dataclass(frozen=True)
class _Row:
  instance: int
  choice: int
  tokens: tuple[int, ...]  # [EOS] + context + continuation, truncated on the left
  num_cont: int  # continuation tokens (the last ones)


def length_buckets(max_len: int, smallest: int = 32) -> list[int]:
  """The padded lengths scoring uses (one compile of ``logits_fn`` each).

  Each is 4x the last: padding at most quadruples a batch's (small) scoring
  compute, and every bucket saved is one compile of the model's forward,
  which costs more than the padding for FP4 models on any device."""
  out, b = [], smallest
  while b < max_len:
    out.append(b)
    b *= 4
  return out + [max_len]


def _rows(tok: Tokenizer, instances: Sequence[TaskInstance], max_len: int) -> list[_Row]:
  contexts = sorted({c for inst in instances for c in inst.contexts})
  conts = sorted({c for inst in instances for c in inst.continuations})
  ctx_ids = dict(zip(contexts, tok.encode_batch(contexts)))
  cont_ids = dict(zip(conts, tok.encode_batch(conts)))
  rows = []
  for i, inst in enumerate(instances):
    for j, (ctx, cont) in enumerate(zip(inst.contexts, inst.continuations)):
      cont_tokens = cont_ids[cont][:max_len]  # a continuation never exceeds the window
      if not cont_tokens:
        raise ValueError(f"empty continuation in doc {inst.doc_id}: {cont!r}")
      full = [tok.eos_id] + ctx_ids[ctx] + cont_tokens
      rows.append(_Row(i, j, tuple(full[-(max_len + 1):]), len(cont_tokens)))
  return rows


@jax.jit
def _score_batch(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  logp_BxTxV = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  target_logp_BxT = jnp.take_along_axis(logp_BxTxV, targets[..., None], axis=-1)[..., 0]
  loglik_B = (target_logp_BxT * mask).sum(-1)
  hit_BxT = (jnp.argmax(logp_BxTxV, axis=-1) == targets) | (mask == 0)
  return loglik_B, hit_BxT.all(-1)


def score_rows(
    logits_fn: LogitsFn, rows: Sequence[_Row], *, batch_size: int, max_len: int, pad_id: int,
) -> tuple[np.ndarray, np.ndarray]:
  """Log-likelihood and greedy-match of each row's continuation.

  Returns:
    (float64[num_rows] summed log-likelihood, bool[num_rows] all-greedy).
  """
  order = sorted(range(len(rows)), key=lambda r: (len(rows[r].tokens), r))
  buckets = length_buckets(max_len)
  loglik = np.zeros(len(rows), np.float64)
  greedy = np.zeros(len(rows), bool)
  start = 0
  while start < len(order):
    length = len(rows[order[start]].tokens) - 1
    T = next(b for b in buckets if b >= length)
    chunk = []
    while (start < len(order) and len(chunk) < batch_size
           and len(rows[order[start]].tokens) - 1 <= T):
      chunk.append(order[start])
      start += 1
    inputs = np.full((batch_size, T), pad_id, np.int32)
    targets = np.full((batch_size, T), pad_id, np.int32)
    mask = np.zeros((batch_size, T), np.float32)
    for b, r in enumerate(chunk):
      seq = np.asarray(rows[r].tokens, np.int32)
      n = seq.shape[0] - 1
      inputs[b, :n] = seq[:-1]
      targets[b, :n] = seq[1:]
      mask[b, n - rows[r].num_cont : n] = 1.0
    logits = jnp.asarray(logits_fn(jnp.asarray(inputs)))
    if logits.shape[:2] != (batch_size, T):
      raise ValueError(f"logits_fn returned {logits.shape}, expected ({batch_size}, {T}, vocab)")
    ll, ok = _score_batch(logits, jnp.asarray(targets), jnp.asarray(mask))
    ll, ok = np.asarray(ll), np.asarray(ok)
    for b, r in enumerate(chunk):
      loglik[r], greedy[r] = ll[b], ok[b]
  return loglik, greedy


def _tie_credit(scores: np.ndarray, gold: int) -> float:
  best = np.isclose(scores, scores.max(), rtol=1e-6, atol=1e-6)
  return float(best[gold]) / float(best.sum())


def score_task(
    logits_fn: LogitsFn,
    tokenizer: Tokenizer,
    spec: TaskSpec,
    instances: Sequence[TaskInstance],
    *,
    max_len: int = 1024,
    batch_size: int = 32,
) -> TaskResult:
  """Scores one task's instances; see the module docstring for the metrics."""
  if not instances:
    raise ValueError(f"{spec.name}: no instances to score")
  rows = _rows(tokenizer, instances, max_len)
  loglik, greedy = score_rows(logits_fn, rows, batch_size=batch_size, max_len=max_len,
                              pad_id=tokenizer.pad_id)
  per_inst: list[list[int]] = [[] for _ in instances]
  for k, row in enumerate(rows):
    per_inst[row.instance].append(k)
  acc = acc_norm = chance = 0.0
  for inst, ks in zip(instances, per_inst):
    if spec.kind == "greedy":
      acc += float(greedy[ks[0]])
      continue
    scores = loglik[ks]
    chars = np.array([max(len(c), 1) for c in inst.continuations], np.float64)
    acc += _tie_credit(scores, inst.gold)
    acc_norm += _tie_credit(scores / chars, inst.gold)
    chance += 1.0 / len(ks)
  n = len(instances)
  if spec.kind == "greedy":
    acc_norm = acc
  result = {"acc": acc / n, "acc_norm": acc_norm / n, "greedy": acc / n}
  return TaskResult(task=spec.name, metric=spec.metric, accuracy=result[spec.metric],
                    acc=acc / n, acc_norm=acc_norm / n, chance=chance / n, num_docs=n)


def evaluate_downstream(
    logits_fn: LogitsFn,
    tokenizer: Tokenizer,
    tasks: Sequence[str] = eval_requests.DEFAULT_TASKS,
    *,
    limit: int | None = None,
    max_len: int = 1024,
    batch_size: int = 32,
    eval_dir: Path | None = None,
    seed: int = 0,
) -> dict[str, TaskResult]:
  """Zero-shot accuracy of a model on several tasks.

  Args:
    logits_fn: ``tokens int32[B, T] -> float[B, T, V]``; called with
      ``B = batch_size`` and ``T`` from a few length buckets <= ``max_len``.
    tokenizer: the model's tokenizer.
    tasks: names from `TASKS` (unknown names raise ValueError).
    limit: score a seeded subsample of this many questions per task.
    max_len: the model's context length.
    batch_size: rows per logits_fn call.
    eval_dir: folder of compact request files (default: bundle, then cache).
    seed: subsample seed.

  Returns:
    ``{task: TaskResult}``.

  Example:
    >>> res = evaluate_downstream(jax.jit(lambda t: model.apply(params, t)),
    ...                           tok, ["piqa", "arc_easy"], limit=200)
    >>> res["piqa"].accuracy, res["piqa"].chance
  """
  specs = [task_spec(t) for t in tasks]  # validates every name before any work
  return {s.name: score_task(logits_fn, tokenizer, s,
                             load_task(s.name, eval_dir=eval_dir, limit=limit, seed=seed),
                             max_len=max_len, batch_size=batch_size)
          for s in specs}


def format_results(results: dict[str, TaskResult]) -> str:
  lines = [f"{'task':<14} {'docs':>6} {'metric':>8} {'acc':>7} {'acc_norm':>8} {'chance':>7}"]
  for r in results.values():
    lines.append(f"{r.task:<14} {r.num_docs:>6} {r.metric:>8} {r.acc:>7.4f} {r.acc_norm:>8.4f} "
                 f"{r.chance:>7.4f}")
  return "\n".join(lines)


def unigram_logits_fn(train_tokens: np.ndarray, vocab_size: int) -> LogitsFn:
  """A context-free baseline: log unigram frequencies of the train split."""
  counts = np.bincount(np.asarray(train_tokens), minlength=vocab_size).astype(np.float64) + 1.0
  logp = jnp.asarray(np.log(counts / counts.sum()), jnp.float32)
  return jax.jit(lambda t: jnp.broadcast_to(logp, t.shape + logp.shape))
