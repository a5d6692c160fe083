"""A prefix-heavy multi-tenant mix, built in (no data): the workload locality-aware fairness is
about (policy=lpm / dlpm on engine=vllm).

`shared_clients` clients each have a long system prompt that every one of their requests starts
with, and hold multi-turn conversations: turn k is sent `think_time` seconds after turn k - 1
ends (a chained trace), and its prompt is turn k - 1's prompt and answer plus a new user
message, so it extends the previous prompt. `unique_clients` clients send single requests whose
prompts share nothing. Conversation starts (shared clients) and requests (unique clients) are
Poisson, `rate` per second per client.

Prompts carry prefix-chained block ids, one per `hash_block` tokens (`Trace.block_hashes`): the
full blocks of a client's system prompt have the client's ids, a turn repeats the ids of the
previous turn's full blocks, and every other block gets a fresh id. Lengths are log-normal
(sigma 0.5) around the given medians, at least 1 token. Seeding: one child stream per client
(`SeedSequence(seed).spawn`), so adding clients never changes another client's requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count

import numpy as np

from traces.schema import Trace, TraceError

SIGMA = 0.5  # log-normal spread of every length


@dataclass(frozen=True)
class PrefixHeavyMix:
    duration: float = 120.0
    shared_clients: int = 2
    unique_clients: int = 2
    rate: float = 0.5  # conversations (shared clients) or requests (unique) per second, each
    system_prompt: int = 2000  # tokens every request of a shared client starts with
    turns: int = 4  # turns per conversation
    user_tokens: int = 200  # median new user tokens per turn
    output_tokens: int = 150  # median output tokens (both kinds of client)
    unique_prompt: int = 2000  # median prompt of a unique client's request
    think_time: float = 2.0  # seconds between a turn's end and the next turn
    hash_block: int = 64  # prompt tokens per block id
    name: str = "prefix_heavy"

    def __post_init__(self) -> None:
        where = f"workload '{self.name}'"
        for key in ("shared_clients", "unique_clients", "system_prompt", "hash_block"):
            v = getattr(self, key)
            if isinstance(v, bool) or int(v) != v or v < 0:
                raise TraceError(f"{where}: {key} must be an integer >= 0, got {v!r}")
        for key in ("turns", "user_tokens", "output_tokens", "unique_prompt", "hash_block"):
            v = getattr(self, key)
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise TraceError(f"{where}: {key} must be an integer >= 1, got {v!r}")
        for key in ("duration", "rate"):
            v = getattr(self, key)
            if not (np.isfinite(v) and v > 0):
                raise TraceError(f"{where}: {key} must be a number > 0, got {v!r}")
        if not (np.isfinite(self.think_time) and self.think_time >= 0):
            raise TraceError(f"{where}: think_time must be a number >= 0, got {self.think_time!r}")
        if self.shared_clients + self.unique_clients < 1:
            raise TraceError(f"{where}: needs at least one client")

    def build(self, seed: int) -> Trace:
        streams = np.random.SeedSequence(seed).spawn(self.shared_clients + self.unique_clients)
        fresh = count()  # the next unused block id
        rows: list[tuple] = []  # (client, arrival, prompt, output, interaction, call, ids)
        conversation = count()
        for i in range(self.shared_clients):
            rng = np.random.default_rng(streams[i])
            system_ids = [next(fresh) for _ in range(self.system_prompt // self.hash_block)]
            for start in self._starts(rng):
                key = next(conversation)
                prompt, ids = self.system_prompt, list(system_ids)
                for turn in range(self.turns):
                    prompt += self._length(rng, self.user_tokens)
                    ids += [next(fresh) for _ in range(self._blocks(prompt) - len(ids))]
                    out = self._length(rng, self.output_tokens)
                    rows.append((f"shared{i}", start, prompt, out, key, turn, np.array(ids)))
                    ids = ids[: prompt // self.hash_block]  # the full blocks carry over
                    prompt += out
        for j in range(self.unique_clients):
            rng = np.random.default_rng(streams[self.shared_clients + j])
            for start in self._starts(rng):
                prompt = self._length(rng, self.unique_prompt)
                fresh_ids = np.array([next(fresh) for _ in range(self._blocks(prompt))])
                out = self._length(rng, self.output_tokens)
                rows.append((f"unique{j}", start, prompt, out, next(conversation), 0, fresh_ids))
        if not rows:
            raise TraceError(f"workload '{self.name}': no request in {self.duration} s")
        rows.sort(key=lambda r: (r[1], r[4], r[5]))
        client, arrival, prompt_len, output_len, interaction, call, hashes = zip(*rows)
        calls = np.bincount(np.array(interaction))[np.array(interaction)]
        return Trace.from_columns(
            client=list(client),
            client_names=[
                *(f"shared{i}" for i in range(self.shared_clients)),
                *(f"unique{j}" for j in range(self.unique_clients)),
            ],
            arrival=np.array(arrival),
            prompt_len=np.array(prompt_len),
            output_len=np.array(output_len),
            optional={
                "interaction_id": np.array(interaction),
                "call_index": np.array(call),
                "num_calls": calls,
            },
            think_time=np.where(np.array(call) > 0, self.think_time, 0.0),
            block_hashes=list(hashes),
            hash_block_tokens=self.hash_block,
            source=f"workload '{self.name}'",
        )

    def _starts(self, rng: np.random.Generator) -> list[float]:
        gaps = rng.exponential(1.0 / self.rate, int(self.rate * self.duration * 2) + 16)
        times = np.cumsum(gaps)
        return times[times < self.duration].tolist()

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.hash_block)

    @staticmethod
    def _length(rng: np.random.Generator, median: int) -> int:
        return max(1, int(round(median * rng.lognormal(0.0, SIGMA))))
