"""Markup to clean text: HTML (lxml), POD (perl's Pod::Text), man (groff), dictd.

Every parser here is a real one for its format (no regular expressions over
HTML): `html_to_text` walks the lxml tree, `pod_to_text` runs ``pod2text``,
`man_to_text` runs ``groff -man -Tutf8`` and `read_dictd` decodes a dictd
database through its index (base64 offsets into the gzip'd ``.dict.dz``).
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

Documents = list[tuple[str, str]]

_BLOCK_TAGS = frozenset(
    "address article aside blockquote caption dd div dl dt figcaption figure h1 h2 h3 h4 h5 h6 "
    "hr li main ol p pre section table tbody thead tfoot tr ul br title".split())
_DROP_TAGS = frozenset(("script", "style", "nav", "noscript", "head", "footer", "header",
                        "form", "button", "svg", "iframe", "select"))
# Navigation and chrome of Sphinx, DocBook, rustdoc and javadoc pages.
_DROP_CLASSES = frozenset((
    "sphinxsidebar", "related", "footer", "headerlink", "navheader", "navfooter", "nav",
    "breadcrumbs", "sidebar", "topbar", "subNav", "bottomNav", "top-nav", "sub-nav",
    "toc", "toctree-wrapper", "rustdoc-toggle", "sidebar-elems", "search-container",
    "copy-path", "src", "out-of-band", "skip-nav", "legalnotice", "docs-sidebar",
))
_MAIN_XPATH = ('//*[@role="main"] | //main | //div[@class="body"] | //div[@id="content"] | '
               '//div[@class="book"] | //div[@class="chapter"]')
_SPACES = re.compile(r"[ \t\u00a0]+")
_BLANKS = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")


def clean_text(text: str) -> str:
  """Unix newlines, no surrounding whitespace."""
  return text.replace("\r\n", "\n").replace("\r", "\n").strip()


def _tidy(text: str) -> str:
  lines = [_SPACES.sub(" ", l).strip() for l in text.split("\n")]
  return _BLANKS.sub("\n\n", "\n".join(lines)).strip()


def _dropped(el) -> bool:
  tag = el.tag if isinstance(el.tag, str) else ""
  if tag in _DROP_TAGS or el.get("role") in ("navigation", "search", "banner", "contentinfo"):
    return True
  return bool(_DROP_CLASSES.intersection((el.get("class") or "").split()))


_LINE_TAGS = frozenset(("br", "li", "tr", "dt", "dd"))


def _walk(el, out: list[str]) -> None:
  """Appends the text under ``el``; source line breaks outside <pre> are spaces."""
  tag = el.tag if isinstance(el.tag, str) else ""
  if tag == "pre":
    # Code and literal blocks keep their line breaks and indentation.
    out.append("\n\n\x00" + "".join(el.itertext()).replace("\n", "\n\x00") + "\n\n")
    return
  if tag in _BLOCK_TAGS:
    out.append("\n" if tag in _LINE_TAGS else "\n\n")
  if el.text:
    out.append(el.text.replace("\n", " "))
  for child in el:
    if isinstance(child.tag, str) and not _dropped(child):
      _walk(child, out)
    if child.tail:
      out.append(child.tail.replace("\n", " "))
  if tag in _BLOCK_TAGS and tag not in _LINE_TAGS:
    out.append("\n\n")
  if tag in ("td", "th"):
    out.append(" ")


def html_to_text(data: bytes | str) -> str:
  """The readable text of an HTML page.

  Drops scripts, styles and navigation chrome, keeps the main content element
  when the page marks one (Sphinx ``role=main``, DocBook ``div.book``...),
  turns block elements into paragraph breaks and keeps ``<pre>`` verbatim.

  Returns:
    Text with single spaces inside lines and at most one blank line between
    paragraphs ("" for an empty page).
  """
  import lxml.html  # pylint: disable=import-outside-toplevel  (optional extra)

  if isinstance(data, str):
    data = data.encode("utf-8")
  if not data.strip():
    return ""
  root = lxml.html.document_fromstring(data)
  mains = root.xpath(_MAIN_XPATH)
  top = mains[0] if mains else (root.find("body") if root.find("body") is not None else root)
  out: list[str] = []
  _walk(top, out)
  raw = "".join(out)
  # Lines of <pre> blocks (marked with \x00) keep their spacing.
  lines = []
  for line in raw.split("\n"):
    lines.append(line.replace("\x00", "").rstrip() if line.startswith("\x00")
                 else _SPACES.sub(" ", line).strip())
  return _BLANKS.sub("\n\n", "\n".join(lines)).strip()


def _run_text(cmd: list[str], data: bytes, timeout: float = 120) -> str:
  proc = subprocess.run(cmd, input=data, capture_output=True, timeout=timeout, check=False)
  if proc.returncode != 0:
    raise ValueError(f"{cmd[0]} exited {proc.returncode}: {proc.stderr[-300:]!r}")
  return proc.stdout.decode("utf-8", errors="replace")


def pod_to_text(data: bytes) -> str:
  """Renders POD with perl's ``pod2text`` (Pod::Text), without overstrike.

  Raises:
    FileNotFoundError: ``pod2text`` is not installed (it ships with perl).
  """
  if shutil.which("pod2text") is None:
    raise FileNotFoundError("pod2text is not on PATH; install perl (apt-get install perl)")
  return clean_text(_run_text(["pod2text", "--utf8", "-"], data))


def man_to_text(data: bytes) -> str:
  """Renders a man page source with ``groff -man -Tutf8``, plain (no SGR, no overstrike).

  Raises:
    FileNotFoundError: groff is not installed (apt-get install groff-base).
  """
  if shutil.which("groff") is None:
    raise FileNotFoundError("groff is not on PATH; apt-get install groff-base")
  text = _run_text(["groff", "-man", "-Tutf8", "-P-cbou", "-rLL=78n", "-t"], data)
  return _tidy(text)


_DICTD_B64 = {c: i for i, c in enumerate(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def dictd_number(code: str) -> int:
  """Decodes a dictd index number (base64 digits, most significant first)."""
  value = 0
  for c in code:
    value = value * 64 + _DICTD_B64[c]
  return value


def read_dictd(index_path: Path, dict_path: Path) -> list[tuple[str, str]]:
  """``(headword, definition)`` for every entry of a dictd database.

  The ``.index`` lists ``headword<TAB>offset<TAB>length`` (dictd base64);
  the ``.dict.dz`` is a gzip stream (dictzip adds only random-access
  metadata). Entries named ``00-database-*`` (the database's own header)
  are skipped; an entry listed under several headwords is read once.
  """
  blob = gzip.decompress(Path(dict_path).read_bytes())
  seen: set[tuple[int, int]] = set()
  entries = []
  for line in Path(index_path).read_text(encoding="utf-8", errors="replace").splitlines():
    parts = line.split("\t")
    if len(parts) < 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
      continue
    span = (dictd_number(parts[1]), dictd_number(parts[2]))
    if span in seen:
      continue
    seen.add(span)
    text = blob[span[0]: span[0] + span[1]].decode("utf-8", errors="replace")
    entries.append((parts[0], text))
  return entries  # index order: dictd indexes are sorted by headword


_XREF = re.compile(r"\{([^{}\n]*)\}")


def dictd_documents(entries: Iterable[tuple[str, str]], *, target_bytes: int = 50_000) -> Documents:
  """Groups dictionary entries (in headword order) into documents.

  A document is a run of consecutive entries of about ``target_bytes``; its
  id is its first headword, so ids are stable and the held-out documents are
  whole stretches of the dictionary. Cross-reference braces (``{word}``) are
  removed and each entry's indentation is kept.
  """
  docs: Documents = []
  current: list[str] = []
  size, first = 0, None
  for head, text in entries:
    body = _XREF.sub(r"\1", clean_text(text))
    if not body:
      continue
    if first is None:
      first = head
    current.append(body)
    size += len(body)
    if size >= target_bytes:
      docs.append((f"{len(docs):05d}-{first}", "\n\n".join(current)))
      current, size, first = [], 0, None
  if current:
    docs.append((f"{len(docs):05d}-{first}", "\n\n".join(current)))
  return docs
