"""Third-party benchmark clients from the package index, GuideLLM, inference-perf and EvalScope,
against `fairsim-serve` on loopback: what each measures (TTFT and inter-token latency medians)
agrees with the times the server simulated, and EvalScope's SLA auto-tune finds the capacity
`fairsim-capacity capacity.mode=evalscope` finds offline.

Each lives in a virtual environment of its own (GuideLLM and EvalScope need PyTorch,
inference-perf Python 3.12): the tests use the executables named by FAIRSIM_GUIDELLM,
FAIRSIM_EVALSCOPE and FAIRSIM_INFERENCE_PERF (as .ci/run sets them) or found on PATH, and skip
otherwise. They run offline with tokenizers the tests build (no model hub)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import Server

pytestmark = pytest.mark.integration  # servers, subprocesses, notebooks or clients

TOKENIZER = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

alphabet = pre_tokenizers.ByteLevel.alphabet()
tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(sys.argv[1])
"""


# one token per word, whatever the word: inference-perf draws prompts as random token ids and
# checks that their text re-tokenizes to the same length, and counts each streamed chunk's
# tokens to time them (fairsim-serve streams one word per chunk)
WORD_TOKENIZER = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

words = ["[UNK]", *(f"w{i}" for i in range(500))]
tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def installed(variable: str, name: str, why: str) -> Path:
    found = os.environ.get(variable) or shutil.which(name)
    if not found or not Path(found).exists():
        pytest.skip(
            f"{name} is not installed: it needs {why}, so .ci/run installs it in a virtual "
            f"environment of its own and names it in {variable}"
        )
    return Path(found)


def simulated_medians(server: Path) -> tuple[float, float]:
    """The server's own median TTFT and gap between a request's tokens, in ms."""
    requests = pd.read_parquet(server / "requests.parquet")
    tokens = pd.read_parquet(server / "tokens.parquet").sort_values(["request_id", "index"])
    gaps = tokens.groupby("request_id").time.diff().dropna()
    return 1e3 * np.median(requests.first_token_at - requests.arrival), 1e3 * np.median(gaps)


def run_against(server: Server, argv: list[str], cwd: Path, timeout: int) -> None:
    """Run a client against the server, then stop the server (it writes its run folder);
    the server is killed if the client failed."""
    try:
        res = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
            env={**os.environ, **OFFLINE},
        )  # fmt: skip
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        server.stop()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def test_guidellm_measures_the_latencies_fairsim_serve_simulated(tmp_path: Path):
    exe = installed("FAIRSIM_GUIDELLM", "guidellm", "PyTorch")
    tokenizer = tmp_path / "tokenizer"
    subprocess.run([str(exe.parent / "python"), "-c", TOKENIZER, str(tokenizer)], check=True)
    server = Server(tmp_path / "server", "policy=fcfs")
    args = [
        "run",
        f"--backend=kind=openai_http,target={server.url.removesuffix('/v1')}",
        "--profile=kind=constant,rate=4",
        "--constraint=kind=max_requests,count=24",
        "--data=kind=synthetic_text,prompt_tokens=256,output_tokens=48",
        f"--tokenizer=kind=hf_auto,model={tokenizer}",
        f"--output=kind=json,path={tmp_path / 'guidellm.json'}",
        "--disable-progress",
    ]
    run_against(server, [str(exe), *args], tmp_path, 240)
    report = json.loads((tmp_path / "guidellm.json").read_text())["benchmarks"][0]
    measured = report["requests"]["successful"]
    requests = pd.read_parquet(tmp_path / "server" / "requests.parquet")
    # what the client did not count as successful, and what the server did not complete
    others = {k: v for k, v in report["requests"].items() if k != "successful" and v}
    unserved = requests[requests.status != "completed"][["request_id", "status", "reason"]]
    assert len(measured) == 24, f"GuideLLM: {json.dumps(others)[:4000]}; server: {unserved}"
    ttft = np.median([r["time_to_first_token_ms"] for r in measured])
    itl = np.median([r["inter_token_latency_ms"] for r in measured])
    assert (requests.status == "completed").all() and len(requests) == 24
    simulated_ttft = 1e3 * np.median(requests.first_token_at - requests.arrival)
    per_token = (requests.finished_at - requests.first_token_at) / (requests.output_len - 1)
    simulated_itl = 1e3 * np.median(per_token)
    print(
        f"GuideLLM TTFT median {ttft:.2f} ms (simulated {simulated_ttft:.2f}), "
        f"ITL median {itl:.2f} ms (simulated {simulated_itl:.2f})"
    )
    assert abs(ttft - simulated_ttft) <= ttft_slack_ms(simulated_ttft)
    assert abs(itl - simulated_itl) <= 10


def ttft_slack_ms(simulated_ms: float) -> float:
    """How far a client's median TTFT may lie from the simulated one: its own time (a Python
    client parsing every stream on the same 2 cores) adds to what it measures. Seen: GuideLLM
    +11.3 ms (27 ms simulated) on an idle 2-core VM, inference-perf +17.6 ms (228 ms, 7.7%)
    in a CI run sharing its machine with another test run."""
    return max(20.0, 0.1 * simulated_ms)


def test_inference_perf_measures_the_latencies_fairsim_serve_simulated(tmp_path: Path):
    """inference-perf splits events on a bare blank line, as vLLM writes them: with CRLF
    framing it reported every request a success with no TTFT, no ITL and 0 output tokens."""
    exe = installed("FAIRSIM_INFERENCE_PERF", "inference-perf", "Python 3.12 or newer")
    tokenizer = tmp_path / "tokenizer"
    subprocess.run([str(exe.parent / "python"), "-c", WORD_TOKENIZER, str(tokenizer)], check=True)
    server = Server(tmp_path / "server", "policy=fcfs")
    fixed = {"type": "fixed", "total_count": 100}
    config = {
        "load": {"type": "constant", "stages": [{"rate": 4, "duration": 6}]},
        "api": {"type": "completion", "streaming": True},
        "server": {
            "type": "vllm",
            "model_name": "fairsim",
            "ignore_eos": True,
            "base_url": server.url.removesuffix("/v1"),
        },  # fmt: skip
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "data": {
            "type": "random",
            "input_distribution": {"min": 256, "max": 256, "mean": 256, **fixed},
            "output_distribution": {"min": 48, "max": 48, "mean": 48, **fixed},
        },
        "storage": {"local_storage": {"path": str(tmp_path / "report")}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    run_against(server, [str(exe), "--config_file", str(tmp_path / "config.yaml")], tmp_path, 240)
    report = json.loads((tmp_path / "report" / "summary_lifecycle_metrics.json").read_text())
    served = pd.read_parquet(tmp_path / "server" / "requests.parquet")
    assert report["successes"]["count"] == len(served) == 24 and not report["failures"]["count"]
    assert (served.status == "completed").all() and (served.output_len == 48).all()
    latency = report["successes"]["latency"]
    ttft = 1e3 * latency["time_to_first_token"]["median"]
    itl = 1e3 * latency["inter_token_latency"]["median"]
    simulated_ttft, simulated_itl = simulated_medians(tmp_path / "server")
    print(
        f"inference-perf TTFT median {ttft:.2f} ms (simulated {simulated_ttft:.2f}), "
        f"ITL median {itl:.2f} ms (simulated {simulated_itl:.2f})"
    )
    assert abs(ttft - simulated_ttft) <= ttft_slack_ms(simulated_ttft)
    assert abs(itl - simulated_itl) <= 10


# EvalScope's SLA auto-tune against fairsim-serve, and `fairsim-capacity capacity.mode=evalscope`
# offline on the same engine, policy and lengths: EvalScope's chat template adds 16 characters
# to each 1,024-character prompt, 260 tokens at fairsim-serve's 4 characters a token
PROMPT_TOKENS, OUTPUT_TOKENS = 260, 48
SLA = '[{"p99_ttft": "<=1000"}]'


def offline_capacity(variable: str, start: int, seed: int) -> tuple[int | None, dict[int, float]]:
    """fairsim-capacity's EvalScope mode offline: the value found and each point's p99 TTFT."""
    from simulator.api import compose_config
    from simulator.apps.capacity.cli import capacity_search

    cfg = compose_config(
        [
            "capacity.mode=evalscope",
            f"capacity.variable={variable}",
            f"capacity.start={start}",
            "capacity.num_runs=1",
            f"capacity.client_seed={seed}",
            "policy=fcfs",
            "workload=fixed_chat",  # the lengths the client sends
            "capacity.sla_params=" + SLA.replace('"p99_ttft"', "p99_ttft"),
        ],
        "capacity",
    )
    client = cfg.workload.clients[0]
    assert (client.prompt.value, client.output.value) == (PROMPT_TOKENS, OUTPUT_TOKENS)
    (result,) = capacity_search(cfg)
    found = None if result.best_value is None else int(result.best_value)
    return found, {int(p.value): p.metrics["p99_ttft"] for p in result.history}


@pytest.mark.parametrize("variable", ["parallel", "rate"])
def test_evalscope_sla_auto_tune_finds_what_fairsim_capacity_finds_offline(tmp_path, variable):
    """The same value for a concurrency and a rate search, and each point's p99 TTFT at most
    25% or 80 ms above the simulation. The client's and the loopback's own time add, and a
    point's p99 is its slowest of 4 requests, so one late request sets it: measured 1-2% above
    on an idle machine, 7.5% (25 ms) at 2 users under CI's load, 11% (49 ms) at 4 users in a CI
    run sharing the machine, and 63 ms above at rate 2, the search's first point (the client's
    first connections), on an idle machine. Below it: a concurrency point at most 5 ms (its users
    send when the previous answer ends, so lateness only adds). Rate points send at times
    both draw from EvalScope's seeded stream, but a send the busy client makes late waits
    that much less behind the queue it joins, and its TTFT is counted from the send: 8.3%
    (44 ms) below at rate 4 under CI's load, so a rate point may be 15% or 60 ms below."""
    exe = installed("FAIRSIM_EVALSCOPE", "evalscope", "PyTorch")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"{f'p{i:03d} ' + 'lorem ipsum ' * 90:.1024}\n" for i in range(400)))
    server = Server(tmp_path / "server", "policy=fcfs")
    load = ["--parallel", "2"] if variable == "parallel" else ["--rate", "2"]
    args = [
        "perf", "--url", f"{server.url}/chat/completions", "--api", "openai",
        "--model", "fairsim", "--dataset", "line_by_line", "--dataset-path", str(prompts),
        "--max-tokens", str(OUTPUT_TOKENS), "--min-tokens", str(OUTPUT_TOKENS), "--stream",
        *load, "--sla-auto-tune", "--sla-variable", variable, "--sla-params", SLA,
        "--sla-num-runs", "1", "--seed", "7", "--outputs-dir", str(tmp_path / "evalscope"),
    ]  # fmt: skip
    run_against(server, [str(exe), *args], tmp_path, 400)
    (summary,) = (tmp_path / "evalscope").glob("*/*/sla_summary.json")
    measured = {}
    for key, point in json.loads(summary.read_text()).items():
        p99 = point["percentiles"]["Percentiles"].index("99%")
        measured[int(key.rsplit("_", 1)[1])] = point["percentiles"]["TTFT (ms)"][p99]
    passed = [v for v, ttft in measured.items() if ttft <= 1000]
    selected = max(passed) if passed else None
    found, simulated = offline_capacity("concurrency" if variable == "parallel" else "rate", 2, 7)
    print(f"EvalScope {variable}: {selected} ({measured}); fairsim offline: {found} ({simulated})")
    assert selected == found
    for value in set(measured) & set(simulated):
        below = 5 if variable == "parallel" else max(0.15 * simulated[value], 60)
        assert measured[value] >= simulated[value] - below, value
        assert measured[value] <= simulated[value] + max(0.25 * simulated[value], 80), value
