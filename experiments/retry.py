"""Rerunning an arm of a results folder on purpose (``--retry ARM[,ARM]``).

An arm that diverged (or finished) is never rerun by accident: ``--resume``
reuses a finished arm's ``final.json`` and reports a diverged one, naming
``--retry``. ``--retry ARM`` starts that arm over: its folder's contents
move to ``<arm>/history/<timestamp>/``, and the command's optimizer settings
(`RETRY_FIELDS`, e.g. ``--lr``) may differ from the folder's for that arm.
``run.json`` keeps the folder's shared settings, each arm's own optimizer
settings under ``arm_settings`` (used again when the arm is resumed) and one
``history`` entry per retry (arm, time, where the old run went, its status,
the settings changed).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

from experiments.run_checks import UsageError

# Optimizer settings a retried arm may change; everything else is the folder's.
RETRY_FIELDS = ("peak_lr", "warmup_steps", "t_max_steps", "final_lr_ratio", "weight_decay", "b1", "b2", "eps",
                "clip_norm")
HISTORY = "history"


def parse_retry(spec: str | None, arms: list[str]) -> list[str]:
  """The arms named by ``--retry`` (each must be one of ``--arms``)."""
  if not spec:
    return []
  names = [a for a in spec.split(",") if a]
  bad = [a for a in names if a not in arms]
  if bad:
    raise UsageError(f"--retry {spec}: {', '.join(bad)} not among --arms {','.join(arms)}; retry only arms "
                     "this command runs.")
  return names


def allowed_differences(retry: list[str]) -> tuple[str, ...]:
  """Run-identity fields a command may change against the folder's run.json."""
  return RETRY_FIELDS if retry else ()


def settle_configs(configs: dict[str, Any], saved: dict[str, Any] | None, retry: list[str]) -> dict[str, Any]:
  """Each arm's config: retried arms take the command's optimizer settings,
  the others keep the folder's (and their own from an earlier retry)."""
  if saved is None:
    return configs
  out = {}
  for arm, cfg in configs.items():
    if arm in retry:
      out[arm] = cfg
      continue
    own = {k: saved["train"][k] for k in RETRY_FIELDS if k in saved["train"]}
    own.update(saved.get("arm_settings", {}).get(arm, {}))
    out[arm] = dataclasses.replace(cfg, **own)
  return out


def start_over(out: Path, arm: str, config: Any, record: dict[str, Any]) -> dict[str, Any] | None:
  """Moves ``out/arm``'s run into ``out/arm/history/<timestamp>/`` and records the retry in ``record``
  (run.json's content, updated in place). Returns the history entry (None: nothing to move)."""
  arm_dir = out / arm
  items = [p for p in arm_dir.iterdir() if p.name != HISTORY] if arm_dir.is_dir() else []
  previous = {}
  final = arm_dir / "final.json"
  if final.is_file():
    previous = json.loads(final.read_text(encoding="utf-8"))
  shared = record["train"]
  before = {**{k: shared.get(k) for k in RETRY_FIELDS}, **record.get("arm_settings", {}).get(arm, {})}
  now = {k: getattr(config, k) for k in RETRY_FIELDS}
  own = {k: v for k, v in now.items() if v != shared.get(k)}
  record.setdefault("arm_settings", {})
  if own:
    record["arm_settings"][arm] = own
  else:
    record["arm_settings"].pop(arm, None)
  if not items:
    return None
  stamp = time.strftime("%Y%m%d-%H%M%S")
  dest = arm_dir / HISTORY / stamp
  n = 1
  while dest.exists():  # two retries within one second
    dest, n = arm_dir / HISTORY / f"{stamp}-{n}", n + 1
  dest.mkdir(parents=True)
  for p in items:
    shutil.move(str(p), str(dest / p.name))
  entry = {"arm": arm, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "moved_to": str(dest.relative_to(out)),
           "previous_status": previous.get("status", "unfinished"),
           "changed": {k: [before.get(k), v] for k, v in now.items() if before.get(k) != v}}
  record.setdefault("history", []).append(entry)
  return entry
