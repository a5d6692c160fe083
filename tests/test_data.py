"""Data: what fairsim ships (unchanged copies, each folder with its licence and notice), how
`data:` paths are found, and `fairsim-data` fetching from a loopback mirror of the upstream
repositories: installed files verified, a corrupt or unreachable download kept out of the cache
with one error line, ServeGen's pool packed into the archive its loader reads."""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import http.server
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import shared_file
from traces.datasets import UPSTREAM, dataset, datasets
from traces.files import SHIPPED_DATA, resolve_path
from traces.schema import TraceError
from traces.servegen import load_servegen_pool

DATA_CLI = [sys.executable, "-c", "from simulator.apps.data.download import main; main()"]


def shipped_files() -> list[Path]:
    return sorted(p for root in SHIPPED_DATA for p in root.rglob("*") if p.is_file())


def test_every_shipped_folder_has_its_licence_and_a_notice_naming_the_source():
    folders = {p.parent for p in shipped_files() if p.suffix in (".csv", ".json")}
    folders = {f if (f / "LICENSE").exists() else f.parents[2] for f in folders}  # vidur's tree
    assert folders, "fairsim ships data"
    for folder in folders:
        assert (folder / "LICENSE").exists(), folder
        notice = (folder / "NOTICE.md").read_text()
        # the public repository it comes from, or (for data with none) the holder the LICENSE names
        holders = [line.strip() for line in (folder / "LICENSE").read_text().splitlines()
                   if line.strip().startswith("Copyright ") and "[" not in line]  # fmt: skip
        assert "github.com/" in notice or any(h in notice for h in holders), folder


def test_shipped_files_are_unchanged_copies_of_the_public_data():
    for path in shipped_files():
        relative = next(path.relative_to(root) for root in SHIPPED_DATA if root in path.parents)
        if path.name == "NOTICE.md" or relative.parts[0] == "fitted":  # fairsim's own figures
            continue
        if path.suffix == ".gz":  # shipped compressed, otherwise unchanged
            original = shared_file(str(relative.with_suffix("")))
            assert gzip.decompress(path.read_bytes()) == original.read_bytes(), relative
            continue
        original = shared_file(str(relative))
        assert path.read_bytes() == original.read_bytes(), relative


def test_data_paths_look_in_the_override_then_shipped_data_then_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("FAIRSIM_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert resolve_path("data:vtc/real_trace.csv") == SHIPPED_DATA[0] / "vtc" / "real_trace.csv"
    with pytest.raises(TraceError, match="`fairsim-data get mooncake` downloads it"):
        resolve_path("data:mooncake/conversation_trace.jsonl")
    with pytest.raises(TraceError, match="set FAIRSIM_DATA_DIR to a folder holding mine/"):
        resolve_path("data:mine/sessions.csv")
    # a table fairsim ships compressed is found under its plain name
    sessions = SHIPPED_DATA[0] / "agentic" / "claude_code_sessions_flat.csv.gz"
    assert resolve_path("data:agentic/claude_code_sessions_flat.csv") == sessions
    cached = tmp_path / "cache" / "fairsim" / "data" / "mooncake" / "conversation_trace.jsonl"
    cached.parent.mkdir(parents=True)
    cached.write_text("{}\n")
    assert resolve_path("data:mooncake/conversation_trace.jsonl") == cached
    override = tmp_path / "mine" / "vtc" / "real_trace.csv"
    override.parent.mkdir(parents=True)
    override.write_text("x\n")
    monkeypatch.setenv("FAIRSIM_DATA_DIR", str(tmp_path / "mine"))
    assert resolve_path("data:vtc/real_trace.csv") == override


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def mirror(tmp_path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTP server holding the upstream files at their upstream paths, built from
    ../shared/data (its URL and its folder)."""
    root = tmp_path / "mirror"
    etalon = dataset("etalon_lengths")
    for f in etalon.files:
        _place(root, f.url, shared_file(f.path))
    pool = tmp_path / "pool"
    with tarfile.open(shared_file("servegen/language_m-small.tar.gz")) as tar:
        tar.extractall(pool, filter="data")
    for f in dataset("servegen").files:
        _place(root, f.url, pool / Path(f.path).relative_to("servegen"))
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def _place(root: Path, url: str, source: Path) -> None:
    target = root / url[len(UPSTREAM) :]
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def fairsim_data(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FAIRSIM_DATA_DIR"}
    env["XDG_CACHE_HOME"] = str(cache)
    return subprocess.run([*DATA_CLI, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.integration
def test_get_installs_verified_files_and_packs_the_servegen_pool(mirror, tmp_path):
    url, _ = mirror
    cache = tmp_path / "cache"
    res = fairsim_data("get", "etalon_lengths", "servegen", "--mirror", url, cache=cache)
    assert res.returncode == 0, res.stderr
    installed = cache / "fairsim" / "data"
    for f in dataset("etalon_lengths").files:
        assert hashlib.sha256((installed / f.path).read_bytes()).hexdigest() == f.sha256
    assert not list(installed.rglob("*.part"))
    packed = load_servegen_pool(installed / "servegen" / "language_m-small.tar.gz")
    original = load_servegen_pool(shared_file("servegen/language_m-small.tar.gz"))
    assert [c.client_id for c in packed] == [c.client_id for c in original]
    assert all(a.windows.equals(b.windows) for a, b in zip(packed, original, strict=True))
    again = fairsim_data("get", "etalon_lengths", "--mirror", url, cache=cache)
    assert again.returncode == 0 and "already installed" in again.stdout
    listed = {
        line.split()[0]: line for line in fairsim_data("list", cache=cache).stdout.splitlines()
    }
    assert set(datasets()) <= set(listed)
    assert "not installed" not in listed["servegen"] and "not installed" in listed["mooncake"]


@pytest.mark.integration
def test_a_corrupt_download_is_not_kept_and_is_one_error_line(mirror, tmp_path):
    url, root = mirror
    remote = dataset("etalon_lengths").files[0]
    served = root / remote.url[len(UPSTREAM) :]
    served.write_bytes(served.read_bytes().replace(b"1", b"2", 1))
    cache = tmp_path / "cache"
    res = fairsim_data("get", "etalon_lengths", "--mirror", url, cache=cache)
    assert res.returncode == 2
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("fairsim-data: error: ") and "not kept" in line
    assert not (cache / "fairsim" / "data" / remote.path).exists()
    assert not list((cache / "fairsim" / "data").rglob("*.part"))


@pytest.mark.integration
def test_an_unreachable_mirror_and_an_unknown_dataset_are_one_error_line(tmp_path):
    with socket_closed() as port:
        res = fairsim_data(
            "get", "mooncake", "--mirror", f"http://127.0.0.1:{port}", cache=tmp_path
        )
    assert res.returncode == 2 and "download failed" in res.stderr.splitlines()[-1]
    res = fairsim_data("get", "nope", cache=tmp_path)
    assert res.returncode == 2 and "dataset 'nope': unknown; accepted: [" in res.stderr


@contextlib.contextmanager
def socket_closed() -> Iterator[int]:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port
