"""Measured vLLM runs logged request by request, replayed (simulator/apps/sim2real/replay.py):
the log's settings and engine-side times read as vLLM took them, the replay command as a user
runs it, and the validation report's sim2real section."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hydra.utils import instantiate

from conftest import shared_file
from simulator.api import compose_config, simulate_config
from simulator.apps.papers import validation
from simulator.apps.sim2real.replay import (
    REPLAY_METRICS,
    load_replayed_run,
    load_replayed_runs,
    replay_overrides,
    simulated_replay_metrics,
)
from simulator.apps.sim2real.runs import signed_error
from simulator.core.errors import ConfigError
from simulator.core.requests import COMPLETED

REPLAYS = "sim2real/llmservingsim"


def logged_run(
    tmp_path: Path, gpu: str = "RTX4090", kv_cache: dict | None = None, **engine_kwargs: object
) -> Path:
    """A small log in LLMServingSim's layout: 4 requests, known engine-clock times."""
    folder = tmp_path / gpu / "Llama-3.1-8B"
    (folder / "vllm").mkdir(parents=True)
    meta = {
        "engine_kwargs": {"tensor_parallel_size": 1, "max_num_seqs": 64,
                          "max_num_batched_tokens": 1024, "max_model_len": None,
                          "dtype": "bfloat16", **engine_kwargs},
        **({"kv_cache": kv_cache} if kv_cache else {}),
    }  # fmt: skip
    (folder / "vllm" / "meta.json").write_text(json.dumps(meta))
    rows = [
        {"input_toks": 100 + 10 * i, "output_toks": 1 + 4 * i, "queued_ts": 50.0 + i,
         "first_token_ts": 50.0 + i + 0.1 * (i + 1), "last_token_ts": 50.0 + i + 0.1 * (i + 1)
         + 0.02 * 4 * i}
        for i in range(4)
    ]  # fmt: skip
    (folder / "vllm" / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_a_log_gives_vllms_settings_and_its_engine_side_times(tmp_path):
    run = load_replayed_run(logged_run(tmp_path, kv_cache={"num_gpu_blocks": 900}))
    assert (run.name, run.gpu, run.model, run.tp, run.dtype) == (
        "rtx-4090-llama-3.1-8b", "rtx-4090", "llama-3.1-8b", 1, "bf16")  # fmt: skip
    assert (run.max_num_seqs, run.max_num_batched_tokens, run.max_model_len) == (64, 1024, None)
    # TTFT 0.1, 0.2, 0.3, 0.4 s from the queue; TPOT 0.02 s for the three multi-token requests
    assert run.measured["ttft_mean"] == pytest.approx(0.25)
    assert run.measured["tpot_mean"] == pytest.approx(0.02)
    assert run.measured["e2e_mean"] == pytest.approx(0.25 + 0.02 * 4 * 1.5)
    overrides = replay_overrides(run)
    assert "engine.num_gpu_blocks=900" in overrides and "policy=fcfs" in overrides
    assert not any(o.startswith("engine.max_model_len") for o in overrides)
    older = load_replayed_run(logged_run(tmp_path / "older"))  # no block count logged
    assert "engine.gpu_memory_utilization=0.9" in replay_overrides(older)


def test_the_replay_sends_each_logged_request_at_its_queue_time_and_scores_from_there(tmp_path):
    run = load_replayed_run(logged_run(tmp_path))
    cfg = compose_config(replay_overrides(run, "fitted"))
    timeline = simulate_config(cfg)
    np.testing.assert_allclose(timeline.arrival, [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(timeline.trace.prompt_len, [100, 110, 120, 130])
    with_frontend = simulated_replay_metrics(timeline, 0.1)
    without = simulated_replay_metrics(timeline, 0.0)
    ttft = timeline.first_token_at - timeline.arrival  # every request completes here
    assert without["ttft_mean"] == pytest.approx(float(ttft.mean()))
    assert with_frontend["ttft_mean"] == pytest.approx(without["ttft_mean"] - 0.1)
    assert with_frontend["tpot_mean"] == without["tpot_mean"]


def test_a_logged_fp8_kv_cache_is_replayed_and_a_quantized_run_is_refused(tmp_path):
    run = load_replayed_run(logged_run(tmp_path / "fp8", kv_cache_dtype="fp8"))
    cfg = compose_config(replay_overrides(run, "fitted"))
    assert cfg.cost_model.kv_cache_dtype == "fp8"
    plain = compose_config(replay_overrides(load_replayed_run(logged_run(tmp_path / "auto"))))
    assert plain.cost_model.kv_cache_dtype == "auto"  # vLLM's default: not written
    with pytest.raises(ConfigError, match="engine_kwargs.quantization 'awq': only unquantized"):
        load_replayed_run(logged_run(tmp_path / "awq", quantization="awq"))


def test_an_unknown_gpu_folder_is_an_error_naming_it_and_the_accepted_ones(tmp_path):
    with pytest.raises(ConfigError, match="GPU folder 'TPUv9' unknown; accepted: RTX4090"):
        load_replayed_run(logged_run(tmp_path, gpu="TPUv9"))


def test_the_logs_times_give_llmservingsims_measured_figures():
    """Our reading of the log (engine clock, from queued_ts) gives the measured column of
    LLMServingSim's own summary, to its printed 0.1 ms."""
    runs = load_replayed_runs(shared_file(REPLAYS))
    assert [r.name for r in runs] == ["rtx-4090-llama-3.1-8b", "rtx-pro-6000-llama-3.1-8b"]
    rows = {"TTFT Mean": "ttft_mean", "TTFT P90": "ttft_p90", "Latency Mean": "e2e_mean",
            "TPOT Mean": "tpot_mean"}  # fmt: skip
    for run in runs:
        summary = (run.requests.parent.parent / "validation" / "summary.txt").read_text()
        for line in summary.splitlines():
            for row, metric in rows.items():
                if line.startswith(row + " "):
                    logged_ms = float(line.split()[-3])
                    assert run.measured[metric] * 1000 == pytest.approx(logged_ms, abs=0.06)
        assert set(run.peer) == set(REPLAY_METRICS)


@pytest.mark.slow
def test_the_fitted_model_replays_both_logs_with_a_per_token_time_within_15_percent():
    """GPUs, a model and a vLLM version no coefficient saw: on both cards TPOT within 15%, and
    on the RTX 4090 (overloaded: preemptions, a 65 s mean TTFT) TTFT and E2E too
    (docs/sim2real.md: 4090 +14.3% / +13.2% / +10.1%; PRO 6000 TPOT -13.7%, its TTFT -33%
    the documented miss)."""
    for run in load_replayed_runs(shared_file(REPLAYS)):
        cfg = compose_config(replay_overrides(run, "fitted"))
        timeline = simulate_config(cfg)
        sim = simulated_replay_metrics(timeline, instantiate(cfg.cost_model).frontend_latency)
        assert bool((timeline.status == COMPLETED).all())  # every logged request completes
        metrics = (
            ("ttft_mean", "e2e_mean", "tpot_mean") if run.gpu == "rtx-4090" else ("tpot_mean",)
        )
        for metric in metrics:
            assert abs(signed_error(sim[metric], run.measured[metric])) <= 15, (run.gpu, metric)


def test_the_sim2real_section_asked_for_without_its_data_is_an_error_naming_the_folder(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("FAIRSIM_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as ended:
        validation.main(["--section", "sim2real", "--out", str(tmp_path / "v.md")])
    assert ended.value.code == 2
    assert "sim2real/inference_sim_training/default_args" in capsys.readouterr().err
    assert (
        validation.sim2real_section(explicit=False, folder=tmp_path) is None
    )  # a full report leaves it out
    assert "sim2real section is left out" in capsys.readouterr().err
