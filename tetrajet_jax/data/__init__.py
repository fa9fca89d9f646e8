"""Training data that works offline: corpus, tokenizer, grain pipeline, bundle.

Build once (registry access needed)::

    python -m tetrajet_jax.data.build            # corpus -> BPE 16k -> arrays
    python -m tetrajet_jax.data.pack --out DIR   # parts of <= 48 MiB for the GPU box
    python -m tetrajet_jax.data.unpack --parts DIR     # there: rebuild + verify into .bundle/

Train::

    data = locate_data("bpe16384")                # bundle first, then cache
    ds = make_train_dataset(data.split_path("train"), seq_len=..., batch_size=..., seed=0)

The grain pipeline is imported lazily so that the corpus builder and the
bundle loader work where grain is not installed yet.
"""

from tetrajet_jax.data.cache import CorruptCacheError, default_cache_dir
from tetrajet_jax.data.corpus import CorpusConfig, build_corpus
from tetrajet_jax.data.eval_requests import TASKS, TaskInstance, TaskSpec, load_task
from tetrajet_jax.data.locate import DataPaths, ensure_bundle_wheels, locate_data
from tetrajet_jax.data.sources import SOURCES, Source, directory_source
from tetrajet_jax.data.tokenized import load_split
from tetrajet_jax.data.tokenizer import Tokenizer, load_dolma2, train_bpe

_LAZY = {
    "make_train_dataset": "tetrajet_jax.data.pipeline",
    "make_val_dataset": "tetrajet_jax.data.pipeline",
    "epoch_batches": "tetrajet_jax.data.pipeline",
    "PackedWindows": "tetrajet_jax.data.pipeline",
    # CLI modules: imported on use so `python -m` runs them without a
    # "found in sys.modules" warning.
    "BuildConfig": "tetrajet_jax.data.build",
    "build": "tetrajet_jax.data.build",
    "pack_bundle": "tetrajet_jax.data.bundle",
    "verify_bundle": "tetrajet_jax.data.bundle",
}


def __getattr__(name: str):
  if name in _LAZY:
    return getattr(__import__(_LAZY[name], fromlist=[name]), name)
  raise AttributeError(f"module 'tetrajet_jax.data' has no attribute {name!r}")


__all__ = [
    "CorpusConfig", "CorruptCacheError", "DataPaths", "SOURCES", "Source", "TASKS", "TaskInstance",
    "TaskSpec", "Tokenizer", "build_corpus", "default_cache_dir", "directory_source",
    "ensure_bundle_wheels", "load_dolma2", "load_split", "load_task", "locate_data",
    "train_bpe", *_LAZY,
]
