"""String paths of pytree leaves: the one place that names a jax key path.

Parameter filters, optimizer masks, sharding rules and OsciReset's state all
address leaves by a tuple of strings, e.g. ``("layers_0", "attn", "qkv",
"kernel")``; list indices appear as their decimal string.
"""

from __future__ import annotations

from typing import Any

import jax


def key_to_str(k: Any) -> str:
  """One jax key-path entry as a string (dict key, sequence index, attribute name)."""
  if isinstance(k, jax.tree_util.DictKey):
    return str(k.key)
  if isinstance(k, jax.tree_util.SequenceKey):
    return str(k.idx)
  if isinstance(k, jax.tree_util.GetAttrKey):
    return k.name
  if isinstance(k, jax.tree_util.FlattenedIndexKey):
    return str(k.key)
  return str(k)


def path_strs(key_path: Any) -> tuple[str, ...]:
  """A jax key path (or an NNX path of str/int entries) as a tuple of strings."""
  return tuple(key_to_str(k) for k in key_path)
