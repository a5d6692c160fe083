"""Every command line in the README runs as written (plus small-scale overrides), so the README
cannot go stale: each `fairsim*` line of its bash blocks is run in a scratch folder and must exit
0 (tests/command_lines.py says how: scale, input files, data and placeholders)."""

from __future__ import annotations

import re
import subprocess

import pytest

from command_lines import command_lines, run_case
from conftest import ROOT

pytestmark = pytest.mark.integration  # servers, subprocesses, notebooks or clients


def readme_blocks() -> list[list[str]]:
    """The `fairsim*` command lines of each of the README's bash blocks; from the quick start,
    the part after the install."""
    text = (ROOT / "README.md").read_text()
    return [command_lines(block) for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


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


@pytest.mark.parametrize("lines", cases(), ids=lambda lines: lines[0][:70])
def test_a_readme_command_runs_as_written(lines, tmp_path):
    for argv in run_case(lines, tmp_path):
        if argv[0] == "fairsim-aggregate":
            readme = (ROOT / "README.md").read_text()
            promised = re.search(r"fairsim-aggregate .*?(\w+) plots", readme)
            plots = sorted(p.name for p in (tmp_path / "work" / argv[1]).glob("*.png"))
            words = {"one": 1, "two": 2, "three": 3}
            assert promised and len(plots) == words[promised.group(1)], plots


def test_ci_fails_when_any_part_of_the_readme_test_command_fails():
    """.ci/run runs the README's test command under `set -e`, which stops at a failure inside
    an && list only at its last command: its line must end the run whichever part fails (a lint
    error once ended the list before the tests, and the run went on to pass)."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    command = next(line for block in blocks for line in block.splitlines() if "pytest" in line)
    ci_line = next(
        line for line in (ROOT / ".ci" / "run").read_text().splitlines() if command in line
    )
    for failing in ("false && true && true", "true && false && true"):
        script = f"set -eo pipefail\n{ci_line.replace(command, failing)}\necho went on\n"
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
        assert done.returncode != 0 and "went on" not in done.stdout, failing
