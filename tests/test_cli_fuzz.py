"""Random command lines never end in a traceback or a hang: hypothesis composes config groups
and overrides any key of the chosen engine, cost model, policy, workload, QoE and cluster with
valid and invalid values; every `fairsim` run at tiny scale either completes (exit 0) or ends
with one line `fairsim: error: ...` and exit 2. Anything else (an internal error, exit 3, a
traceback, a run past its time limit) is a bug the test reports with its command line.

`FAIRSIM_FUZZ_EXAMPLES=N` runs N examples (default 20, derandomized so CI is repeatable);
`FAIRSIM_FUZZ_EXPLORE=1` draws new ones each time."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf

from simulator.api import compose_config

pytestmark = pytest.mark.integration  # servers, subprocesses, notebooks or clients

CHOICES = {
    "engine": ["slora", "vllm"],
    "cost_model": ["a10g_llama7b", "roofline", "fitted"],
    "policy": [
        "fcfs", "rpm", "lcf", "vtc", "vtc_oracle", "vtc_predict", "drr", "priority",
        "fairserve", "fs_w", "fs_wl", "fs_wo", "rpm_interaction",
    ],
    "workload": [
        "vtc_overload", "poisson_chat", "closed_loop_chat", "arena_like", "servegen_like",
        "copilot_like", "vtc_artifact",
    ],
}  # fmt: skip
FUZZED = ("engine", "cost_model", "policy", "workload", "qoe", "cluster")
# valid-looking and invalid values alike, small enough that no run grows large
VALUES = [
    "-1", "0", "1", "3", "50", "0.5", "1e-9", "abc", "''", "null", "true", "[1,2]",
    "{a: 1}", "10k", "-0.5", "nan", "inf",
]  # fmt: skip
# last on the line, so they win: tiny runs whatever else is chosen
TINY = ["engine.horizon=3", "compare_with=null", "progress=false", "veeksha_metrics=false"]
EXAMPLES = int(os.environ.get("FAIRSIM_FUZZ_EXAMPLES", "20"))
CASE_LIMIT_S = 120


def leaf_keys(node: Any, prefix: str) -> list[str]:
    """Dotted keys of a config node's values, through mappings (a list is one value)."""
    if not isinstance(node, DictConfig):
        return [prefix]
    keys: list[str] = []
    for key in node:
        if str(key).startswith("_"):
            continue
        value = node._get_node(key)
        keys += (
            leaf_keys(value, f"{prefix}.{key}")
            if isinstance(value, DictConfig)
            else [f"{prefix}.{key}"]
        )
    return keys


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    groups = [f"{g}={draw(st.sampled_from(options))}" for g, options in CHOICES.items()]
    cfg = compose_config(groups)
    keys = sorted(
        k
        for group in FUZZED
        for k in leaf_keys(cfg[group], group)
        if k != "engine.horizon" and OmegaConf.select(cfg, k, throw_on_missing=False) != "???"
    )
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True))
    return [*groups, *(f"{k}={draw(st.sampled_from(VALUES))}" for k in chosen)]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("FAIRSIM_FUZZ_EXPLORE") != "1",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(args=command_lines())
def test_any_command_line_completes_or_fails_with_one_input_error_line(args, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fuzz") / "run"
    line = " ".join(args)
    try:
        res = subprocess.run(
            [sys.executable, "-c", "from simulator.apps.run.cli import main; main()", *args, *TINY,
             f"hydra.run.dir={run_dir}"],
            capture_output=True,
            text=True,
            timeout=CASE_LIMIT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AssertionError(f"fairsim {line}: still running after {CASE_LIMIT_S} s") from None
    assert "Traceback" not in res.stderr, f"fairsim {line}\n{res.stderr}"
    assert res.returncode in (0, 2), f"fairsim {line}: exit {res.returncode}\n{res.stderr}"
    if res.returncode == 2:
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("fairsim: error: "), f"fairsim {line}\n{res.stderr}"
        others = res.stderr.strip().splitlines()[:-1]
        assert all(o.startswith("fairsim: ") for o in others), f"fairsim {line}\n{res.stderr}"
