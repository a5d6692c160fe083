"""Public data fairsim does not ship, and how `fairsim-data` fetches it.

`traces/datasets.json` lists each dataset's files with the public URL (pinned to a commit), the
SHA-256 and the size; `data:<dataset>/...` paths then find them in the user's cache
(`traces.files.data_cache`). A file is downloaded to a temporary name, checked against its size
and SHA-256, and only then renamed into place, so the cache never holds a file that failed its
check. A dataset with `pack` is also packed into that one archive (ServeGen pools are read from a
.tar.gz in place). The small data fairsim needs itself ships with it instead (traces/data,
cost_models/data, each with its LICENSE and NOTICE).
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from traces.schema import TraceError

MANIFEST = Path(__file__).with_name("datasets.json")
UPSTREAM = "https://raw.githubusercontent.com/"
CHUNK = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    path: str  # where it goes under the cache: <dataset>/...
    url: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Dataset:
    name: str
    source: str
    licence: str
    files: tuple[RemoteFile, ...]
    pack: str | None = None  # an archive of the files, relative to the cache

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def datasets() -> dict[str, Dataset]:
    raw = json.loads(MANIFEST.read_text())
    return {
        name: Dataset(
            name,
            d["source"],
            d["licence"],
            tuple(RemoteFile(**f) for f in d["files"]),
            d.get("pack"),
        )
        for name, d in raw.items()
    }


def dataset(name: str) -> Dataset:
    known = datasets()
    if name not in known:
        raise TraceError(f"dataset {name!r}: unknown; accepted: {sorted(known)}")
    return known[name]


def is_installed(ds: Dataset, cache: Path) -> bool:
    wanted = [cache / ds.pack] if ds.pack else [cache / f.path for f in ds.files]
    return all(p.exists() for p in wanted)


def fetch(
    ds: Dataset,
    cache: Path,
    mirror: str | None = None,
    report: Callable[[RemoteFile, int], None] | None = None,
) -> list[Path]:
    """Download every file of `ds` not already in `cache` (from `mirror` instead of GitHub when
    given: a URL the upstream paths are appended to), verify it, and pack the dataset if it has
    an archive. Returns the paths written."""
    written = []
    for i, remote in enumerate(ds.files):
        target = cache / remote.path
        if target.exists() and _sha256(target) == remote.sha256:
            continue
        url = remote.url
        if mirror is not None and url.startswith(UPSTREAM):
            url = mirror.rstrip("/") + "/" + url[len(UPSTREAM) :]
        _download(url, target, remote)
        written.append(target)
        if report is not None:
            report(remote, i + 1)
    if ds.pack:
        archive = cache / ds.pack
        if written or not archive.exists():
            _pack(ds, cache, archive)
            written.append(archive)
    return written


def _download(url: str, target: Path, remote: RemoteFile) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=60) as response, part.open("wb") as out:
            while block := response.read(CHUNK):
                digest.update(block)
                size += len(block)
                out.write(block)
    except (urllib.error.URLError, OSError) as err:
        part.unlink(missing_ok=True)
        raise TraceError(f"{url}: download failed ({err}); nothing was kept") from None
    if size != remote.size or digest.hexdigest() != remote.sha256:
        part.unlink(missing_ok=True)
        raise TraceError(
            f"{url}: got {size} bytes with SHA-256 {digest.hexdigest()[:16]}...; expected "
            f"{remote.size} bytes with {remote.sha256[:16]}... (not kept)"
        )
    part.replace(target)


def _pack(ds: Dataset, cache: Path, archive: Path) -> None:
    """A deterministic .tar.gz of the dataset's files, named as under <dataset>/ (fixed order,
    times and owners), written under a temporary name first."""
    root = cache / ds.name
    part = archive.with_name(archive.name + ".part")
    with tarfile.open(part, "w:gz") as tar:
        for remote in sorted(ds.files, key=lambda f: f.path):
            path = cache / remote.path
            info = tar.gettarinfo(path, arcname=str(path.relative_to(root)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with path.open("rb") as f:
                tar.addfile(info, f)
    part.replace(archive)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()
