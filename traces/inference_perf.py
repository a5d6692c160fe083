"""An inference-perf config (kubernetes-sigs/inference-perf's own YAML or JSON schema) as a
workload: the requests that benchmark client would send, when it would send them.

Supported, as inference-perf generates them:
- `data.type: shared_prefix`: `num_groups` (alias `num_unique_system_prompts`) system prompts,
  `num_prompts_per_group` (alias `num_users_per_system_prompt`) questions each; lengths
  `system_prompt_len`, `question_len`, `output_len` fixed or a distribution; the prompt list is
  shuffled once, and request i sends prompt i mod (groups x prompts per group). A prompt is its
  group's system prompt then its question (plus the BOS token the server adds). Prefix-block
  ids (16 tokens each) make the system prompt shared within its group and a prompt sent again
  identical to itself, so the engine's prefix cache sees what the server's would.
  `enable_multi_turn_chat` sends each prompt as one user's turns: the measured runs of that mode
  show prompt lengths that never grow from turn to turn (no history is carried), so a turn is
  its prompt again, as above. (Fitted to the training runs, this reading predicted them much
  closer than one where every turn's text is new, whose fit did not settle.)
- `data.type: random` / `synthetic`: `input_distribution` and `output_distribution`, one draw
  per request, nothing shared.
- `load.type: constant` (per stage, rate x duration requests at exponential gaps rescaled to
  span the stage exactly) or `poisson` (per second a Poisson number of requests, spread the
  same way over that second), with `stages` of `rate` and `duration`, one after another.
- `load.request_timeout`: the client gives up on a request this many seconds after sending it
  (unset: 300 s, the default total timeout of the aiohttp session inference-perf's client
  opens); the engine drops it then, waiting or running (reason `client_timeout`), and
  inference-perf counts it as failed.
- `server.ignore_eos`: true makes every answer exactly `output_len` tokens. With false a real
  server may stop early at an end-of-sequence token, which no config predicts: fairsim still
  generates `output_len` tokens (an upper bound), and says so.

Distributions: `{type: fixed | normal | lognormal | uniform, mean, std_dev | variance, min,
max}`, drawn as inference-perf draws them (clipped to [min, max], rounded). Anything else in the
file is a one-line error naming the field.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from traces.files import resolve_path
from traces.schema import Trace, TraceError

BLOCK_TOKENS = 16  # tokens per prefix-block id (vLLM's default KV block)
# seconds after which inference-perf's client gives up on a request when `load.request_timeout`
# is unset: its aiohttp session then keeps aiohttp's default total timeout, 5 minutes
DEFAULT_REQUEST_TIMEOUT = 300.0

# the fields read, per section; the others listed are accepted and change nothing fairsim models
# (where results go, the client's own concurrency and connections, its tokenizer, the endpoint)
FIELDS: dict[str, set[str]] = {
    "": {"api", "data", "load", "server", "report", "storage", "tokenizer", "metrics"},
    "api": {"type", "streaming", "headers"},
    "data": {"type", "shared_prefix", "input_distribution", "output_distribution", "path"},
    "data.shared_prefix": {
        "num_groups",
        "num_unique_system_prompts",
        "num_prompts_per_group",
        "num_users_per_system_prompt",
        "system_prompt_len",
        "question_len",
        "output_len",
        "seed",
        "question_distribution",
        "output_distribution",
        "enable_multi_turn_chat",
    },
    "load": {
        "type",
        "stages",
        "num_workers",
        "worker_max_concurrency",
        "worker_max_tcp_connections",
        "interval",
        "request_timeout",
    },
    "load.stages": {"rate", "duration"},
    "server": {"type", "base_url", "model_name", "ignore_eos", "api_key"},
    "distribution": {"type", "mean", "std_dev", "variance", "min", "max", "total_count"},
}
DATA_TYPES = ("shared_prefix", "random", "synthetic")
LOAD_TYPES = ("constant", "poisson")
DISTRIBUTIONS = ("fixed", "normal", "lognormal", "uniform")


@dataclass(frozen=True)
class InferencePerfWorkload:
    """`workload=inference_perf workload.path=PROFILE`: the requests of an inference-perf run."""

    path: str
    name: str = "inference_perf"

    def config(self) -> dict[str, Any]:
        return read_config(self.path)

    def configured_rate(self) -> float:
        stages = self.config()["load"]["stages"]
        total = sum(float(s["rate"]) * float(s["duration"]) for s in stages)
        return total / sum(float(s["duration"]) for s in stages)

    def build(self, seed: int) -> Trace:
        cfg = self.config()
        where = str(self.path)
        arrival_ss, data_ss = np.random.SeedSequence(seed).spawn(2)
        arrival = send_times(cfg["load"], np.random.default_rng(arrival_ss), where)
        data = cfg["data"]
        if not (cfg.get("server") or {}).get("ignore_eos", False):
            print(
                f"fairsim: {where}: server.ignore_eos is false: a real server may stop an answer "
                "early; fairsim generates output_len tokens (an upper bound)",
                file=sys.stderr,
            )
        timeout = np.full(arrival.shape[0], request_timeout(cfg["load"]))
        if data["type"] == "shared_prefix":
            return shared_prefix_trace(data["shared_prefix"], arrival, timeout, seed, where)
        rng = np.random.default_rng(data_ss)
        n = arrival.shape[0]
        prompt = draw(data.get("input_distribution"), n, rng, f"{where}: data.input_distribution")
        output = draw(data.get("output_distribution"), n, rng, f"{where}: data.output_distribution")
        return Trace.from_columns(
            client=["client"] * n,
            arrival=arrival,
            prompt_len=np.maximum(prompt, 1),
            output_len=np.maximum(output, 1),
            client_timeout=timeout,
        )


def read_config(path: str | Path) -> dict[str, Any]:
    """The config file (YAML or JSON), its fields checked against what fairsim supports."""
    file = resolve_path(path, "inference-perf config")
    text = file.read_text()
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError:
        import yaml  # JSON is YAML too; PyYAML comes with hydra-core

        try:
            cfg = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise TraceError(f"{path}: not YAML or JSON ({str(err).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise TraceError(f"{path}: an inference-perf config is a mapping of sections")
    _check_fields(cfg, "", str(path))
    data, load = cfg.get("data"), cfg.get("load")
    if not isinstance(data, dict) or data.get("type") not in DATA_TYPES:
        got = data.get("type") if isinstance(data, dict) else data
        raise TraceError(f"{path}: data.type={got!r}; supported: {', '.join(DATA_TYPES)}")
    if data["type"] == "shared_prefix" and not isinstance(data.get("shared_prefix"), dict):
        raise TraceError(f"{path}: data.type shared_prefix needs a data.shared_prefix section")
    if not isinstance(load, dict) or load.get("type", "constant") not in LOAD_TYPES:
        got = load.get("type") if isinstance(load, dict) else load
        raise TraceError(f"{path}: load.type={got!r}; supported: {', '.join(LOAD_TYPES)}")
    server = cfg.get("server")
    if server is not None and not isinstance(server, dict):
        raise TraceError(f"{path}: server={server!r}; expected a section (a mapping)")
    eos = (server or {}).get("ignore_eos", False)
    if not isinstance(eos, bool):
        raise TraceError(f"{path}: server.ignore_eos={eos!r}; expected true or false")
    stages = load.get("stages")
    if not isinstance(stages, list) or not stages:
        raise TraceError(f"{path}: load.stages must be a non-empty list of {{rate, duration}}")
    timeout = load.get("request_timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
    ):
        raise TraceError(f"{path}: load.request_timeout={timeout!r}; expected seconds > 0 or null")
    for i, stage in enumerate(stages):
        for key in ("rate", "duration"):
            v = stage.get(key) if isinstance(stage, dict) else None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise TraceError(f"{path}: load.stages[{i}].{key}={v!r}; expected a number > 0")
    return cfg


def request_timeout(load: dict[str, Any]) -> float:
    """Seconds after sending a request at which inference-perf's client gives up on it."""
    value = load.get("request_timeout")
    return DEFAULT_REQUEST_TIMEOUT if value is None else float(value)


def _check_fields(node: dict[str, Any], section: str, path: str) -> None:
    allowed = FIELDS[section]
    for key, value in node.items():
        name = f"{section}.{key}" if section else key
        if key not in allowed:
            raise TraceError(
                f"{path}: {name} is not supported; accepted in "
                f"{section or 'the top level'}: {', '.join(sorted(allowed))}"
            )
        if name in FIELDS and isinstance(value, dict):
            _check_fields(value, name, path)
        elif name == "load.stages" and isinstance(value, list):
            for stage in value:
                if isinstance(stage, dict):
                    _check_fields(stage, "load.stages", path)
        elif isinstance(value, dict) and (key.endswith(("_distribution", "_len"))):
            _check_fields(value, "distribution", path)


def send_times(load: dict[str, Any], rng: np.random.Generator, where: str) -> np.ndarray:
    """When inference-perf sends each request: its stages one after another."""
    times: list[np.ndarray] = []
    start = 0.0
    for stage in load["stages"]:
        rate, duration = float(stage["rate"]), float(stage["duration"])
        if load.get("type", "constant") == "constant":
            times.append(start + _spread(rng, int(rate * duration), duration))
        else:
            counts = rng.poisson(rate, int(np.ceil(duration)))
            times += [start + s + _spread(rng, int(c), 1.0) for s, c in enumerate(counts) if c]
        start += duration
    sent = np.concatenate(times) if times else np.zeros(0)
    if sent.shape[0] == 0:
        raise TraceError(f"{where}: load.stages send no request (rate x duration < 1)")
    return sent


def _spread(rng: np.random.Generator, n: int, span: float) -> np.ndarray:
    """n send times over `span`: exponential gaps rescaled to sum to `span` exactly."""
    if n == 0:
        return np.zeros(0)
    gaps = rng.exponential(1.0 / n * span, n)
    return np.cumsum(gaps * (span / gaps.sum()))


def number(value: Any, where: str, integer: bool = False) -> float:
    """A config value that must be a (finite) number, or an integer: else an error naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise TraceError(f"{where}={value!r}; expected a number")
    if integer and value != int(value):
        raise TraceError(f"{where}={value!r}; expected an integer")
    return float(value)


def draw(spec: Any, n: int, rng: np.random.Generator, where: str) -> np.ndarray:
    """n lengths of a fixed value or a distribution, drawn as inference-perf draws them."""
    if not isinstance(spec, dict):
        length = number(spec, where)
        if length < 0:
            raise TraceError(f"{where}={spec!r}: expected a length >= 0")
        return np.full(n, int(length), dtype=np.int64)
    kind = spec.get("type", "normal")
    if kind not in DISTRIBUTIONS:
        raise TraceError(f"{where}.type={kind!r}; supported: {', '.join(DISTRIBUTIONS)}")
    low = int(number(spec.get("min", 10), f"{where}.min"))
    high = int(number(spec.get("max", 1024), f"{where}.max"))
    mean = number(spec.get("mean", 512), f"{where}.mean")
    if "variance" in spec:
        variance = number(spec["variance"], f"{where}.variance")
        std = float(np.sqrt(variance)) if variance >= 0 else -1.0
    else:
        std = number(spec.get("std_dev", 200), f"{where}.std_dev")
    if low > high or std < 0 or low < 0:
        raise TraceError(f"{where}: needs 0 <= min <= max and std_dev (or variance) >= 0")
    if kind == "fixed":
        return np.full(n, int(mean), dtype=np.int64)
    if kind == "uniform":
        values = rng.uniform(low, high, n)
    elif kind == "lognormal":
        shifted = max(mean - low, 1.0)
        sigma2 = np.log(1 + (std / shifted) ** 2)
        values = rng.lognormal(np.log(shifted) - sigma2 / 2, np.sqrt(sigma2), n) + low
    else:
        if not low <= mean <= high:
            raise TraceError(f"{where}: mean {mean} is outside [min, max]")
        values = rng.normal(mean, std, n)
    return np.clip(np.round(np.clip(values, low, high)), low, high).astype(np.int64)


def shared_prefix_trace(
    sp: dict[str, Any], arrival: np.ndarray, timeout: np.ndarray, seed: int, where: str
) -> Trace:
    """The shared-prefix generator's prompts, sent in turn as request i uses prompt i mod P
    (`timeout`: when each one's client gives up)."""
    key = f"{where}: data.shared_prefix"
    groups_given = sp.get("num_groups", sp.get("num_unique_system_prompts", 10))
    per_group_given = sp.get("num_prompts_per_group", sp.get("num_users_per_system_prompt", 10))
    groups = int(number(groups_given, f"{key}.num_groups", integer=True))
    per_group = int(number(per_group_given, f"{key}.num_prompts_per_group", integer=True))
    if groups < 1 or per_group < 1:
        raise TraceError(f"{where}: data.shared_prefix needs at least one group and one prompt")
    own_seed = sp.get("seed", seed)
    if isinstance(own_seed, bool) or not isinstance(own_seed, int) or own_seed < 0:
        raise TraceError(f"{key}.seed={own_seed!r}; expected an integer >= 0")
    rng = np.random.default_rng(own_seed)
    system = draw(sp.get("system_prompt_len", 100), groups, rng, f"{key}.system_prompt_len")
    questions, outputs = [], []
    for _ in range(groups):
        q = sp.get("question_distribution") or sp.get("question_len", 50)
        o = sp.get("output_distribution") or sp.get("output_len", 50)
        questions.append(draw(q, per_group, rng, f"{key}.question_len"))
        outputs.append(draw(o, per_group, rng, f"{key}.output_len"))
    group = np.repeat(np.arange(groups), per_group)
    question = np.concatenate(questions)
    output = np.concatenate(outputs)
    order = rng.permutation(group.shape[0])  # inference-perf shuffles its prompt list once
    group, question, output = group[order], question[order], output[order]
    prompt = 1 + system[group] + question  # BOS, the system prompt, the question
    n = arrival.shape[0]
    which = np.arange(n) % group.shape[0]  # request i sends prompt i mod P
    fresh = iter(range(10**12))
    system_ids = [[next(fresh) for _ in range((1 + s) // BLOCK_TOKENS)] for s in system.tolist()]
    blocks = [  # each prompt's blocks: its group's system prompt, then its own question
        np.array(
            system_ids[g] + [next(fresh) for _ in range(p // BLOCK_TOKENS - len(system_ids[g]))],
            dtype=np.int64,
        )
        for g, p in zip(group.tolist(), prompt.tolist(), strict=True)
    ]
    ids = [blocks[i] for i in which.tolist()]  # a prompt sent again is the same text
    return Trace.from_columns(
        client=[f"group{g}" for g in group[which].tolist()],
        client_names=[f"group{g}" for g in range(groups)],
        arrival=arrival,
        prompt_len=prompt[which],
        output_len=np.maximum(output[which], 1),
        block_hashes=ids,
        hash_block_tokens=BLOCK_TOKENS,
        client_timeout=timeout,
    )
