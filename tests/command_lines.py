"""Running documented `fairsim*` command lines as written, at small scale (for the README's
commands, tests/test_readme_commands.py, and the examples in conf/ comments,
tests/test_config_examples.py).

Each case runs in a scratch folder holding the input files the examples name (`my_profile.csv`,
`my.csv`, `trace.jsonl`); lines that read data fairsim does not ship find it through
FAIRSIM_DATA_DIR (tests/conftest.py points it at ../shared/data) and skip when that is absent; a
line naming a placeholder host needs a real Ray cluster and is skipped by name."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from conftest import BIN, SHARED_DATA, Server

# small scale: runs stop early; a sweep's jobs skip the comparison and the Veeksha files
RUN_OVERRIDES = ["engine.horizon=20", "progress=false"]
SWEEP_OVERRIDES = [
    "engine.horizon=30",
    "progress=false",
    "compare_with=null",
    "veeksha_metrics=false",
]
NEEDS_DATA = ("etalon_", "servegen")  # not shipped: fetched data
PLACEHOLDERS = ("HOST:6379",)
MIXTRAL_CONFIG = {  # the fields fairsim reads of Mixtral-8x7B-v0.1's published config.json
    "architectures": ["MixtralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}


def command_lines(text: str) -> list[str]:
    """The `fairsim*` command lines of a shell snippet: line continuations joined, comments
    and anything before a last `&&` removed."""
    lines = []
    for line in text.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        line = line.rsplit("&&", 1)[-1].strip()
        if line.startswith("fairsim"):
            lines.append(line)
    return lines


def run_case(lines: list[str], tmp_path: Path) -> list[list[str]]:
    """Run `lines` one after another in one scratch folder (later lines may read what earlier
    ones wrote); a `fairsim-bench` line measures a `fairsim-serve` started for it. Each must
    succeed. Returns each line's arguments as run."""
    joined = " ".join(lines)
    if any(p in joined for p in PLACEHOLDERS):
        pytest.skip("needs a running Ray cluster's address (HOST is a placeholder)")
    if any(marker in joined for marker in NEEDS_DATA) and not SHARED_DATA.exists():
        pytest.skip(f"reads {SHARED_DATA}, which is absent")
    if "hydra/launcher=ray" in joined:
        pytest.importorskip(
            "hydra_plugins.hydra_ray_launcher", reason="the ray extra: pip install -e '.[ray]'"
        )
    work = tmp_path / "work"
    work.mkdir()
    write_example_inputs(work)
    target = Server(tmp_path / "target", "policy=fcfs") if "fairsim-bench" in joined else None
    try:
        return [
            run_line(line, work, tmp_path / f"run{i}", target.url if target else None)
            for i, line in enumerate(lines)
        ]
    finally:
        if target is not None:
            target.stop()


def write_example_inputs(work: Path) -> None:
    """The files the documented examples name: a step-cost profile, a table trace with
    millisecond timestamps in column `ts`, a Mooncake JSONL trace, an inference-perf config and
    a model's config.json."""
    (work / "my_profile.csv").write_text(
        "phase,batch_size,tokens,seconds\nprefill,1,100,0.01\nprefill,4,4000,0.09\n"
        "decode,1,100,0.01\ndecode,8,800,0.012\ndecode,4,4000,0.02\n"
    )
    (work / "my_inference_perf.yaml").write_text(  # an inference-perf config
        "data:\n  type: shared_prefix\n  shared_prefix: {num_groups: 2, num_prompts_per_group: 3,"
        " system_prompt_len: 100, question_len: 400, output_len: 60,"
        " enable_multi_turn_chat: true}\n"
        "load:\n  type: constant\n  stages: [{rate: 4, duration: 10}]\n"
        "server: {type: vllm, ignore_eos: true}\n"
    )
    (work / "my_model").mkdir()
    (work / "my_model" / "config.json").write_text(json.dumps(MIXTRAL_CONFIG))
    rows = [(i * 250, 100 + 37 * i % 400, 20 + 11 * i % 90) for i in range(40)]
    (work / "my.csv").write_text(
        "ts,prompt_len,output_len\n" + "".join(f"{t},{p},{o}\n" for t, p, o in rows)
    )
    (work / "trace.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": t,
                    "input_length": 512 * (1 + i % 3),
                    "output_length": o,
                    "hash_ids": list(range(1 + i % 3)),
                }
            )
            + "\n"
            for i, (t, _, o) in enumerate(rows)
        )
    )


def scaled(argv: list[str], run_dir: Path, target: str | None = None) -> list[str]:
    """The command at small scale; `target`: the URL of the fairsim-serve a bench measures."""
    program, args = argv[0], argv[1:]
    if program == "fairsim" and "-m" in args:
        return [*argv, *SWEEP_OVERRIDES]
    named = any(a.startswith("hydra.run.dir=") for a in args)  # later lines read that folder
    if program == "fairsim":
        return [*argv, *RUN_OVERRIDES, *([] if named else [f"hydra.run.dir={run_dir}"])]
    if program == "fairsim-bench":
        assert target is not None
        args = [a for a in args if not a.startswith("target.url=")]
        small = ["workload.duration=6", "progress=false"]
        if "workload=poisson_chat" in args:  # fewer and shorter answers than its default
            small += [
                "workload.clients.0.arrival.rate=3",
                "workload.clients.0.output.max_value=200",
            ]
        return [program, *args, f"target.url={target}", *small]
    if program == "fairsim-serve":
        return [*argv, "serve.port=0", f"hydra.run.dir={run_dir}"]
    if program == "fairsim-capacity":
        return [*argv, "progress=false", f"hydra.run.dir={run_dir}"]
    return argv


def run_line(line: str, work: Path, run_dir: Path, target: str | None) -> list[str]:
    argv = scaled(shlex.split(line), run_dir, target)
    if argv[0] == "fairsim-serve":  # a server: it must start, answer, and stop on SIGINT
        serve_until_healthy(argv, work)
    else:
        res = subprocess.run(
            [str(BIN / argv[0]), *argv[1:]],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, f"{line}\n{res.stderr[-3000:]}"
    if argv[0] == "fairsim" and "-m" not in argv:
        check_few_refused(line, work, argv)
    if argv[0] == "fairsim-capacity":
        check_capacity_found(line, run_dir)
    return argv


def check_capacity_found(line: str, run_dir: Path) -> None:
    """A documented capacity search finds a capacity for each of its criteria groups (the
    EvalScope example once searched whole requests/s above what the engine sustains and found
    none)."""
    doc = json.loads((run_dir / "capacity_search_results.json").read_text())
    notes = [(g["criteria"], g["note"]) for g in doc["groups"] if g["best_value"] is None]
    assert not notes, f"{line}\n{notes}"


def check_few_refused(line: str, work: Path, argv: list[str]) -> None:
    """A documented run serves its workload: at most 1% of its requests are refused as never
    fitting the engine (a prompt longer than a prefill batch or a pool; Azure's conversation
    trace has a few such outliers for the S-LoRA engine's 3,072-token batch). More would make
    it an example of a misconfiguration."""
    folder = work / [a for a in argv if a.startswith("hydra.run.dir=")][-1].split("=", 1)[1]
    summary = json.loads((folder / "summary.json").read_text())
    unfit = summary["unfit_requests"]  # counted over the whole trace, past the test's horizon
    assert sum(unfit.values()) <= 0.01 * summary["requests"], f"{line}\n{unfit}"


def serve_until_healthy(argv: list[str], work: Path) -> None:
    """Start a `fairsim-serve` line, wait for its health answer, stop it with SIGINT."""
    proc = subprocess.Popen([str(BIN / argv[0]), *argv[1:]], cwd=work, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+)/v1", line)
        assert match, f"{' '.join(argv)}: {line}"
        with urllib.request.urlopen(match.group(1) + "/health", timeout=30) as answer:
            assert answer.read() == b"ok"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
