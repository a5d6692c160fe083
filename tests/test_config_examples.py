"""Every example command in the comments of conf/ runs as written (plus small-scale overrides),
so a config file's usage note cannot go stale: an example is a comment line indented by at least
two spaces after `#` that starts with `fairsim` (a trailing `\\` continues it on the next comment
line). Examples the README also gives are run by tests/test_readme_commands.py, not twice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_readme_commands import readme_commands

from command_lines import command_lines, run_case
from conftest import ROOT

pytestmark = pytest.mark.integration  # servers, subprocesses, notebooks or clients

EXAMPLE = re.compile(r"^\s{2,}fairsim")
# prose that names a command with overrides outside an example line, e.g. "e.g. fairsim x=1"
UNMARKED = re.compile(r"fairsim[\w-]* [^`]*\w=")


def comment_bodies(path: Path) -> list[str]:
    """The text after `#` of each comment line of a YAML file."""
    lines = path.read_text().splitlines()
    return [line.split("#", 1)[1] for line in lines if line.lstrip().startswith("#")]


def conf_examples() -> list[tuple[str, str]]:
    """(config file, command line) of every example in conf/'s comments."""
    out = []
    for path in sorted((ROOT / "conf").rglob("*.yaml")):
        indented = [body for body in comment_bodies(path) if re.match(r"^\s{2,}\S", body)]
        for line in command_lines(re.sub(r"\\\n\s*", " ", "\n".join(indented))):
            out.append((str(path.relative_to(ROOT)), line))
    return out


def test_examples_are_found_and_every_command_in_a_comment_is_one():
    examples = conf_examples()
    files = {name for name, _ in examples}
    assert len(examples) >= 15 and {"conf/serve.yaml", "conf/capacity.yaml"} <= files
    unmarked = [
        (str(path.relative_to(ROOT)), body)
        for path in sorted((ROOT / "conf").rglob("*.yaml"))
        for body in comment_bodies(path)
        if UNMARKED.search(body) and not EXAMPLE.match(body)
    ]
    assert not unmarked, "write examples on their own indented comment line, so they are run"


NOT_IN_README = [(name, line) for name, line in conf_examples() if line not in readme_commands()]


@pytest.mark.parametrize("name, line", NOT_IN_README, ids=lambda v: v[:70])
def test_a_config_example_runs_as_written(name, line, tmp_path):
    run_case([line], tmp_path)
