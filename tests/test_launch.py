"""The commands' entry points (simulator/apps/launch.py)."""

import re
import signal
import subprocess
import sys

import pytest

from conftest import BIN, ROOT, wait_until_loading
from simulator.apps.launch import COMMANDS


def test_every_installed_command_is_launched_by_its_own_module():
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    scripts = dict(re.findall(r'^([\w-]+) = "([^"]+)"$', section, flags=re.M))
    assert set(scripts) == set(COMMANDS)
    assert set(scripts.values()) == {"simulator.apps.launch:main"}
    for module in COMMANDS.values():
        assert hasattr(__import__(module, fromlist=["main"]), "main"), module


@pytest.mark.integration
def test_ctrl_c_while_the_command_still_loads_is_one_line_and_exit_130(tmp_path):
    """SIGINT once numpy is loaded lands in the command's imports (about a second on a 2-core
    machine); it printed a 30-line KeyboardInterrupt traceback of the import machinery."""
    proc = subprocess.Popen(
        [str(BIN / "fairsim"), f"hydra.run.dir={tmp_path / 'run'}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    wait_until_loading(proc.pid)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["fairsim: interrupted (SIGINT)"], err


def test_a_script_under_another_name_is_refused_in_one_line():
    launcher = (
        "import sys; sys.argv[0] = 'fairsim-nope'; from simulator.apps.launch import main; main()"
    )
    res = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 1 and "unknown command 'fairsim-nope'" in res.stderr
