"""A third-party benchmark client from the package index, GuideLLM, against `fairsim-serve` on
loopback: what it measures (TTFT and inter-token latency medians) agrees with the times the
server simulated.

GuideLLM needs PyTorch, so it lives in a virtual environment of its own: the test uses the
`guidellm` named by FAIRSIM_GUIDELLM (as .ci/run sets it) or found on PATH, and skips otherwise.
It runs offline with a byte-level tokenizer the test builds (no model hub)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

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


def guidellm() -> Path:
    found = os.environ.get("FAIRSIM_GUIDELLM") or shutil.which("guidellm")
    if not found or not Path(found).exists():
        pytest.skip(
            "guidellm is not installed: it needs PyTorch, so .ci/run installs it in a virtual "
            "environment of its own and names it in FAIRSIM_GUIDELLM"
        )
    return Path(found)


def test_guidellm_measures_the_latencies_fairsim_serve_simulated(tmp_path: Path):
    exe = guidellm()
    tokenizer = tmp_path / "tokenizer"
    subprocess.run([str(exe.parent / "python"), "-c", TOKENIZER, str(tokenizer)], check=True)
    server = Server(tmp_path / "server", "policy=fcfs")
    try:
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
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        res = subprocess.run(
            [str(exe), *args], capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        server.stop()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
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
    assert abs(ttft - simulated_ttft) <= 10
    assert abs(itl - simulated_itl) <= 10
