"""Every command line in the README runs as written (plus small-scale overrides), so the README
cannot go stale: each `fairsim*` line of its bash blocks is run in a scratch folder and must exit
0. Lines that read data fairsim does not ship find it through FAIRSIM_DATA_DIR (tests/conftest.py
points it at ../shared/data) and skip when that is absent; the Ray-cluster line needs a real
cluster's address and is skipped by name."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT, SHARED_DATA, Server

BIN = Path(sys.executable).parent
# small scale: runs stop early; a sweep's jobs skip the comparison and the Veeksha files
RUN_OVERRIDES = ["engine.horizon=20", "progress=false"]
SWEEP_OVERRIDES = [
    "engine.horizon=30",
    "progress=false",
    "compare_with=null",
    "veeksha_metrics=false",
]
NEEDS_DATA = ("etalon_", "servegen", "agentic", "mooncake")  # not shipped: fetched data
PLACEHOLDERS = ("HOST:6379",)


def readme_blocks() -> list[list[str]]:
    """The `fairsim*` command lines of each of the README's bash blocks, comments and line
    continuations removed; from the quick start, the part after the install."""
    text = (ROOT / "README.md").read_text()
    blocks: list[list[str]] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines: list[str] = []
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            line = line.rsplit("&&", 1)[-1].strip()
            if line.startswith("fairsim"):
                lines.append(line)
        blocks.append(lines)
    return blocks


def readme_commands() -> list[str]:
    return [line for block in readme_blocks() for line in block]


def cases() -> list[list[str]]:
    """One case per command; `fairsim-aggregate` goes with the sweep it reads, and a block
    that measures (`fairsim-bench`) is one case: its later lines read the folders it writes."""
    out: list[list[str]] = []
    for block in readme_blocks():
        if any(line.startswith("fairsim-bench") for line in block):
            out.append(block)
            continue
        for line in block:
            if line.startswith("fairsim-aggregate") and out:
                out[-1].append(line)
            else:
                out.append([line])
    return out


def test_the_readme_has_the_commands_this_test_runs():
    lines = readme_commands()
    assert lines[0] == "fairsim", "the quick start's default run comes first"
    assert len(lines) >= 25 and any(line.startswith("fairsim -m") for line in lines)


def scaled(argv: list[str], run_dir: Path, target: str | None = None) -> list[str]:
    """The command at small scale; `target`: the URL of the fairsim-serve a bench measures."""
    program, args = argv[0], argv[1:]
    if program == "fairsim" and "-m" in args:
        return [*argv, *SWEEP_OVERRIDES]
    named = any(a.startswith("hydra.run.dir=") for a in args)  # later lines read that folder
    if program == "fairsim":
        return [*argv, *RUN_OVERRIDES, *([] if named else [f"hydra.run.dir={run_dir}"])]
    if program == "fairsim-bench":
        assert target is not None
        args = [a for a in args if not a.startswith("target.url=")]
        small = [
            "workload.duration=6",
            "workload.clients.0.arrival.rate=3",
            "progress=false",
            "workload.clients.0.output.max_value=200",
        ]
        return [program, *args, f"target.url={target}", *small]
    if program == "fairsim-serve":
        return [*argv, "serve.port=0", f"hydra.run.dir={run_dir}"]
    if program == "fairsim-capacity":
        return [*argv, "progress=false", f"hydra.run.dir={run_dir}"]
    return argv


@pytest.mark.parametrize("lines", cases(), ids=lambda lines: lines[0][:70])
def test_a_readme_command_runs_as_written(lines, tmp_path):
    joined = " ".join(lines)
    if any(p in joined for p in PLACEHOLDERS):
        pytest.skip("needs a running Ray cluster's address (HOST is a placeholder)")
    if any(marker in joined for marker in NEEDS_DATA) and not SHARED_DATA.exists():
        pytest.skip(f"reads {SHARED_DATA}, which is absent")
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_profile.csv").write_text(
        "phase,batch_size,tokens,seconds\nprefill,1,100,0.01\nprefill,4,4000,0.09\n"
        "decode,1,100,0.01\ndecode,8,800,0.012\ndecode,4,4000,0.02\n"
    )
    target = Server(tmp_path / "target", "policy=fcfs") if "fairsim-bench" in joined else None
    try:
        for i, line in enumerate(lines):
            run_line(line, work, tmp_path / f"run{i}", target.url if target else None)
    finally:
        if target is not None:
            target.stop()


def run_line(line: str, work: Path, run_dir: Path, target: str | None) -> None:
    argv = scaled(shlex.split(line), run_dir, target)
    if argv[0] == "fairsim-serve":  # a server: it must start, answer, and stop on SIGINT
        serve_until_healthy(argv, work)
    else:
        res = subprocess.run(
            [str(BIN / argv[0]), *argv[1:]],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, f"{line}\n{res.stderr[-3000:]}"
    if argv[0] == "fairsim-aggregate":
        readme = (ROOT / "README.md").read_text()
        promised = re.search(r"fairsim-aggregate .*?(\w+) plots", readme)
        plots = sorted(p.name for p in (work / argv[1]).glob("*.png"))
        words = {"one": 1, "two": 2, "three": 3}
        assert promised and len(plots) == words[promised.group(1)], plots


def serve_until_healthy(argv: list[str], work: Path) -> None:
    """Start a `fairsim-serve` line, wait for its health answer, stop it with SIGINT."""
    proc = subprocess.Popen([str(BIN / argv[0]), *argv[1:]], cwd=work, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+)/v1", line)
        assert match, f"{' '.join(argv)}: {line}"
        with urllib.request.urlopen(match.group(1) + "/health", timeout=30) as answer:
            assert answer.read() == b"ok"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
