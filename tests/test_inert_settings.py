"""Settings given on the command line for a block that is off get a note instead of being
ignored silently (simulator/api/inert_settings.py)."""

from __future__ import annotations

import subprocess

from conftest import BIN
from simulator.api import compose_config
from simulator.api.inert_settings import inert_overrides

INERT_BY_DEFAULT = {
    "gateway.flow_control.fairness=vtc": "gateway.flow_control.enabled is false",
    "cluster.autoscaler.max_replicas=4": "cluster.autoscaler.enabled is false",
    "gateway.admission.rate=5": "gateway.admission.type is always, not token_bucket",
    "gateway.admission.overload_queue_depth=3": "not tier_shedding",
    "cluster.routing.delay=1": "no dispatcher is `scored`",
    "cluster.disaggregation.threshold=3": "cluster.prefill_replicas is 0",
    "gateway.saturation.queue_depth=2": "both off",
    "replication_jobs=2": "replications is 1",
}
ALWAYS_READ = ["gateway.flow_control.enabled=false", "engine.pool_tokens=5000", "seed=3"]


def test_each_setting_of_a_block_that_is_off_gets_a_note_saying_why():
    cfg = compose_config([])
    notes = inert_overrides(cfg, [*INERT_BY_DEFAULT, *ALWAYS_READ])
    assert len(notes) == len(INERT_BY_DEFAULT)
    for note, (override, why) in zip(notes, INERT_BY_DEFAULT.items(), strict=True):
        assert note.startswith(f"{override.split('=')[0]} has no effect: ") and why in note


def test_the_same_settings_with_their_blocks_on_get_no_note():
    on = [
        "gateway.flow_control.enabled=true",
        "cluster.autoscaler.enabled=true",
        "gateway.admission.type=token_bucket",
        "gateway.admission.rate=5",
        "cluster.dispatcher=scored",
        "cluster.prefill_replicas=1",
        "cluster.decode_replicas=1",
        "engine=vllm",
        "replications=3",
    ]
    cfg = compose_config(on)
    settings = [o for o in INERT_BY_DEFAULT if "overload_queue_depth" not in o]
    assert inert_overrides(cfg, [*on, *settings]) == []
    shedding = compose_config(["gateway.admission.type=tier_shedding"])
    assert inert_overrides(shedding, ["gateway.admission.overload_queue_depth=3"]) == []
    # saturation admission reads the saturation settings without flow control
    saturation = compose_config(["gateway.admission.type=saturation"])
    assert inert_overrides(saturation, ["gateway.saturation.queue_depth=2"]) == []


def test_the_note_reaches_the_console_and_the_run_goes_on(tmp_path):
    res = subprocess.run(
        [str(BIN / "fairsim"), "gateway.flow_control.fairness=vtc", "workload.duration=5",
         "compare_with=null", "pictures=false", "veeksha_metrics=false", "progress=false",
         f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip().splitlines() == [
        "fairsim: note: gateway.flow_control.fairness has no effect: "
        "gateway.flow_control.enabled is false"
    ]


def test_a_capacity_search_notes_the_settings_its_mode_does_not_read():
    from simulator.apps.capacity.cli import unread_by_mode

    etalon = compose_config([], "capacity")
    notes = inert_overrides(
        etalon,
        ["capacity.precision=2", "capacity.sla_params=[]", "capacity.max_iterations=5"],
        unread_by_mode(etalon.capacity),
    )
    assert notes == [
        "capacity.precision has no effect: capacity.mode is etalon (read by veeksha)",
        "capacity.sla_params has no effect: capacity.mode is etalon (read by evalscope, "
        "steady_state)",
    ]
    evalscope = compose_config(["capacity.mode=evalscope"], "capacity")
    notes = inert_overrides(
        evalscope,
        ["slos=[]", "qoe.tbt_deadline=0.05", "capacity.lower=2"],
        unread_by_mode(evalscope.capacity),
    )
    assert [n.split(" has no effect")[0] for n in notes] == ["slos", "qoe.tbt_deadline"]
    assert all("judges capacity.sla_params" in n for n in notes)
