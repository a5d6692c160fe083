"""The config check (simulator/api/config_check.py) names the key of a value that cannot be
used before anything is built (that it passes every config fairsim ships is checked with their
composition, in test_config_and_cli.py)."""

from __future__ import annotations

import pytest
from omegaconf.errors import MissingMandatoryValue

from simulator.api import compose_config
from simulator.api.config_check import check_config
from simulator.core.errors import ConfigError


# (the command-line test in test_config_and_cli.py covers seed=abc, 10k and unknown keys)
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["seed=-1"], "seed=-1: expected an integer >= 0"),
        (["progress=3"], "progress=3: expected true or false"),
        (["engine.pool_tokens=2.5"], "engine.pool_tokens=2.5: expected an integer"),
        (["engine.horizon=soon"], "engine.horizon='soon': expected a number or null"),
        (["cluster.replicas=null"], "cluster.replicas=None: expected an integer"),
        (["workload.clients=-1"], "workload.clients=-1: expected a list"),
        (["workload=servegen_like", "workload.pool_seed=-1"], "workload.pool_seed=-1"),
        (["policy._target_=policies.Nope"], "policy._target_: cannot import 'policies.Nope'"),
    ],
)
def test_a_bad_value_is_named_by_its_key(overrides, message):
    with pytest.raises(ConfigError, match="^" + message.replace("[", r"\[").replace("(", r"\(")):
        check_config(compose_config(overrides))


def test_integral_numbers_pass_for_integers_and_integers_for_numbers():
    check_config(compose_config(["engine.pool_tokens=2e4", "workload.duration=60"]))


def test_a_mandatory_value_left_unset_names_its_key():
    with pytest.raises(MissingMandatoryValue) as info:
        check_config(compose_config(["cost_model=table"]))
    assert info.value.full_key == "cost_model.path"
