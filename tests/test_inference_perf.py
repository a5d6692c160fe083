"""inference-perf configs as workloads (traces/inference_perf.py): the requests and send times
inference-perf's generators make, prefix-block ids the engine's cache can use, and one-line
errors for what fairsim does not support."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import shared_file
from traces import InferencePerfWorkload, TraceError

PROFILE = {
    "api": {"streaming": True, "type": "completion"},
    "data": {
        "type": "shared_prefix",
        "shared_prefix": {
            "num_unique_system_prompts": 3,
            "num_users_per_system_prompt": 4,
            "system_prompt_len": 100,
            "question_len": 466,
            "output_len": 247,
            "enable_multi_turn_chat": True,
        },
    },
    "load": {
        "type": "constant",
        "stages": [{"rate": 5, "duration": 20}, {"rate": 10, "duration": 10}],
    },
    "server": {"type": "vllm", "ignore_eos": True, "base_url": "http://localhost:8000"},
}


def write(tmp_path: Path, profile: dict, name: str = "profile.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(profile) if name.endswith(".yaml") else json.dumps(profile))
    return str(path)


def test_constant_stages_send_rate_times_duration_requests_inside_each_stage(tmp_path):
    trace = InferencePerfWorkload(write(tmp_path, PROFILE)).build(0)
    arrival = trace.arrival
    assert len(trace) == 5 * 20 + 10 * 10
    assert np.all(np.diff(arrival) >= 0)
    assert ((arrival > 0) & (arrival <= 20)).sum() == 100  # stage 0 ends exactly at 20 s
    assert arrival[-1] == pytest.approx(30.0)  # each stage's gaps are rescaled to span it


@pytest.mark.parametrize("multi_turn", [False, True])
def test_shared_prefix_prompts_share_their_group_prefix_and_repeat_turn_after_turn(
    tmp_path, multi_turn
):
    profile = json.loads(json.dumps(PROFILE))
    profile["data"]["shared_prefix"]["enable_multi_turn_chat"] = multi_turn
    trace = InferencePerfWorkload(write(tmp_path, profile)).build(1)
    prompts = 3 * 4
    assert set(trace.prompt_len.tolist()) == {1 + 100 + 466}  # BOS, system prompt, question
    assert set(trace.output_len.tolist()) == {247}
    ids = trace.block_hashes
    assert trace.hash_block_tokens == 16
    system_blocks = (1 + 100) // 16
    for i in range(len(trace) - prompts):  # request i sends prompt i mod 12
        np.testing.assert_array_equal(ids[i][:system_blocks], ids[i + prompts][:system_blocks])
        np.testing.assert_array_equal(ids[i], ids[i + prompts])  # the same text again
    groups: dict[str, set[tuple[int, ...]]] = {}
    for client, blocks in zip(trace.client.tolist(), ids, strict=True):
        groups.setdefault(trace.client_names[client], set()).add(tuple(blocks[:system_blocks]))
    assert len(groups) == 3 and all(len(prefixes) == 1 for prefixes in groups.values())
    firsts = [next(iter(p)) for p in groups.values()]
    assert len(set(firsts)) == 3  # no two groups share a system prompt
    assert len({tuple(b) for b in ids}) == prompts  # a question is its prompt's own


def test_poisson_stages_average_their_rate_and_json_configs_read_the_same(tmp_path):
    profile = {**PROFILE, "load": {"type": "poisson", "stages": [{"rate": 20, "duration": 200}]}}
    trace = InferencePerfWorkload(write(tmp_path, profile, "p.json")).build(3)
    assert len(trace) / 200 == pytest.approx(20, rel=0.05)
    assert InferencePerfWorkload(write(tmp_path, profile, "p.json")).configured_rate() == 20


def test_random_lengths_are_drawn_clipped_and_rounded_as_inference_perf_draws_them(tmp_path):
    dist = {"type": "normal", "mean": 300, "std_dev": 200, "min": 100, "max": 400}
    profile = {
        "data": {"type": "random", "input_distribution": dist, "output_distribution": dist},
        "load": {"type": "constant", "stages": [{"rate": 50, "duration": 40}]},
        "server": {"ignore_eos": True},
    }
    trace = InferencePerfWorkload(write(tmp_path, profile)).build(0)
    for lengths in (trace.prompt_len, trace.output_len):
        assert lengths.min() == 100 and lengths.max() == 400  # clipped: both ends are hit
        assert 260 < lengths.mean() < 300  # a normal around 300 clipped more above than below
    assert trace.block_hashes is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data": {"type": "shareGPT"}}, "data.type='shareGPT'; supported: shared_prefix"),
        ({"load": {"type": "sweep", "stages": []}}, "load.type='sweep'; supported: constant"),
        ({"circuit_breakers": []}, "circuit_breakers is not supported"),
        (
            {"load": {"type": "constant", "stages": [{"rate": 5, "duration": 0}]}},
            "stages[0].duration",
        ),
        (
            {"data": {"type": "shared_prefix", "shared_prefix": {"num_groups": 2, "nope": 1}}},
            "data.shared_prefix.nope is not supported; accepted in data.shared_prefix:",
        ),
    ],
)
def test_an_unsupported_field_is_one_error_naming_it(tmp_path, change, message):
    path = write(tmp_path, {**PROFILE, **change})
    with pytest.raises(TraceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        InferencePerfWorkload(path).build(0)


SHARED = PROFILE["data"]["shared_prefix"]
RANDOM = {"type": "random", "input_distribution": 100, "output_distribution": 5}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"server": 5}, "server=5; expected a section"),
        ({"server": {"ignore_eos": "yes"}}, "server.ignore_eos='yes'; expected true or false"),
        (
            {"data": {"type": "shared_prefix", "shared_prefix": {**SHARED, "question_len": "4"}}},
            "data.shared_prefix.question_len='4'; expected a number",
        ),
        (
            {"data": {"type": "shared_prefix", "shared_prefix": {**SHARED, "num_groups": 2.5}}},
            "data.shared_prefix.num_groups=2.5; expected an integer",
        ),
        (
            {"data": {"type": "shared_prefix", "shared_prefix": {**SHARED, "seed": "s"}}},
            "data.shared_prefix.seed='s'; expected an integer >= 0",
        ),
        (
            {
                "data": {
                    "type": "random",
                    "input_distribution": {"min": [1]},
                    "output_distribution": 5,
                }
            },
            "data.input_distribution.min=[1]; expected a number",
        ),
        (
            {
                "data": {
                    "type": "random",
                    "input_distribution": {"variance": -4},
                    "output_distribution": 5,
                }
            },
            "data.input_distribution: needs 0 <= min <= max and std_dev",
        ),
    ],
)
def test_a_value_of_the_wrong_kind_is_one_error_naming_its_field(tmp_path, change, message):
    path = write(tmp_path, {**PROFILE, **change})
    with pytest.raises(TraceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        InferencePerfWorkload(path).build(0)


def test_a_measured_runs_profile_gives_its_request_count_and_lengths():
    profile = shared_file(
        "sim2real/inference_sim_training/default_args/"
        "20260217-155451-llama-2-7b-tp1-codegen/profile.yaml"
    )
    trace = InferencePerfWorkload(str(profile)).build(0)
    assert len(trace) == 5 * 600 + 10 * 600  # the run's 9,000 requests (all succeeded)
    assert set(trace.prompt_len.tolist()) == {1 + 100 + 466}
    assert len(set(trace.client.tolist())) == 11  # num_unique_system_prompts


def test_the_workload_runs_vllms_first_come_first_served_unless_a_policy_is_named():
    """inference-perf measures an unmodified vLLM, whose scheduler is FCFS: the workload's
    config selects policy=fcfs, and a policy on the command line still wins."""
    from simulator.api import compose_config

    base = ["workload=inference_perf", "workload.path=profile.yaml"]
    assert compose_config(base).policy._target_ == "policies.FCFS"
    assert compose_config([*base, "policy=vtc"]).policy._target_ == "policies.VTC"
    assert compose_config(["policy=drr", *base]).policy._target_ == "policies.DRR"
    assert compose_config([]).policy._target_ == "policies.VTC"  # other workloads: unchanged
