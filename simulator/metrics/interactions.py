"""FairServe's metrics (docs/metrics.md §5): pure functions of `requests.parquet`.

An interaction is the calls sharing an `interaction_id` (a request without one is an interaction
of one call). A call is *throttled* when the policy rejected it, by a rule (`rpm_limit`,
`user_limit`, `app_limit`) or because its interaction already was (`interaction_throttled`,
`interaction_aborted`); an interaction is throttled when any of its calls was. Wasted tokens are
the prompt tokens of calls that were admitted although their interaction was throttled (output
tokens spent on them are reported beside). The user of a request is its client.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

DROPPED = ("interaction_throttled", "interaction_aborted")  # calls of an interaction cut short


def with_interactions(requests: pd.DataFrame) -> pd.DataFrame:
    """The frame with `interaction` (a key), `user` and `app` columns always present."""
    df = requests.copy()
    if "interaction_id" in df:
        df["interaction"] = df["interaction_id"].astype(np.int64)
    else:
        df["interaction"] = -1 - np.arange(len(df), dtype=np.int64)
    if "user" not in df:
        df["user"] = df["client"]
    if "app" not in df:
        df["app"] = "default"
    df["throttled"] = df["status"].astype(str) == "rejected"
    return df


def throttling(requests: pd.DataFrame) -> dict[str, Any]:
    """Throttled calls and interactions, wasted tokens, in total and per user and app."""
    df = with_interactions(requests)
    hit = df.groupby("interaction")["throttled"].transform("any")
    admitted = df["admitted_at"].notna()
    wasted = df[hit & admitted]
    throttled = df[df["throttled"]]
    by_rule = throttled["reason"].astype(str).value_counts()

    def per(key: str) -> dict[str, dict[str, int]]:
        calls = throttled.groupby(key, observed=True).size()
        inter = df[hit].groupby(key, observed=True)["interaction"].nunique()
        out = {}
        for name in sorted(set(calls.index.astype(str)) | set(inter.index.astype(str))):
            out[name] = {
                "requests": int(calls.get(name, 0)),
                "interactions": int(inter.get(name, 0)),
            }
        return out

    return {
        "throttled_requests": int(len(throttled)),
        "throttled_interactions": int(df.loc[hit, "interaction"].nunique()),
        "dropped_requests": int(throttled["reason"].astype(str).isin(DROPPED).sum()),
        "by_rule": {str(k): int(v) for k, v in by_rule.items()},
        "wasted_tokens": int(wasted["prompt_len"].sum()),
        "wasted_output_tokens": int(wasted["tokens_emitted"].sum()),
        "per_user": per("user"),
        "per_app": per("app"),
    }


def interaction_table(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per interaction: user, app, calls, start (first arrival), end (last finish),
    status (`completed` when every call completed, `throttled`, else `unfinished`)."""
    df = with_interactions(requests)
    done = df["status"].astype(str) == "completed"
    g = df.assign(done=done).groupby("interaction", sort=True)
    out = pd.DataFrame(
        {
            "user": g["user"].first().astype(str),
            "app": g["app"].first().astype(str),
            "calls": g.size(),
            "start": g["arrival"].min(),
            "end": g["finished_at"].max(),
            "completed": g["done"].all(),
            "throttled": g["throttled"].any(),
        }
    )
    out["status"] = np.where(
        out["completed"], "completed", np.where(out["throttled"], "throttled", "unfinished")
    )
    out["completion_time"] = np.where(out["completed"], out["end"] - out["start"], np.nan)
    return out.drop(columns=["completed"]).reset_index()


def user_experience(requests: pd.DataFrame, wait_threshold: float = 1.0) -> dict[str, Any]:
    """Served users (a final response among users who got any feedback), service provided
    (interactions completed without throttling among those that ended), and the share of users
    with a call that waited in the queue longer than `wait_threshold` seconds."""
    inter = interaction_table(requests)
    ended = inter[inter["status"] != "unfinished"]
    users_fed = ended["user"].nunique()
    users_served = ended.loc[ended["status"] == "completed", "user"].nunique()
    df = with_interactions(requests)
    waited = (df["admitted_at"] - df["arrival"]) > wait_threshold
    users = df["user"].astype(str).nunique()
    return {
        "served_users": int(users_served),
        "users_with_feedback": int(users_fed),
        "served_user_share": users_served / users_fed if users_fed else float("nan"),
        "service_provided": int((ended["status"] == "completed").sum()),
        "interactions_ended": int(len(ended)),
        "service_provided_share": (
            float((ended["status"] == "completed").mean()) if len(ended) else float("nan")
        ),
        "users_who_waited_share": (
            df.loc[waited, "user"].astype(str).nunique() / users if users else float("nan")
        ),
        "wait_threshold_s": wait_threshold,
    }


def per_app(requests: pd.DataFrame, duration: float) -> pd.DataFrame:
    """Per app: prompt and decode throughput (tokens/s over `duration`), TTFT mean / p50 / p99
    of calls that got a first token, and the mean interaction completion time."""
    df = with_interactions(requests)
    df["app"] = df["app"].astype(str)
    admitted = df[df["admitted_at"].notna()]
    ttft = (df["first_token_at"] - df["arrival"]).rename("ttft")
    inter = interaction_table(requests)
    rows = []
    for app in sorted(df["app"].unique()):
        mine = df["app"] == app
        t = ttft[mine].dropna()
        rows.append(
            {
                "app": app,
                "calls": int(mine.sum()),
                "prompt_tokens_per_s": admitted.loc[admitted["app"] == app, "prompt_len"].sum()
                / duration,
                "decode_tokens_per_s": df.loc[mine, "tokens_emitted"].sum() / duration,
                "ttft_mean": float(t.mean()) if len(t) else float("nan"),
                "ttft_p50": float(t.quantile(0.5)) if len(t) else float("nan"),
                "ttft_p99": float(t.quantile(0.99)) if len(t) else float("nan"),
                "interaction_time_mean": float(
                    inter.loc[inter["app"] == app, "completion_time"].mean()
                ),
            }
        )
    return pd.DataFrame(rows)


def interaction_latency(requests: pd.DataFrame, users: str | None = None) -> dict[str, float]:
    """Completion time of completed interactions (optionally only users whose name contains
    `users`, or, with a leading '!', does not): mean, p50, p90, p99 and the count."""
    inter = interaction_table(requests)
    if users is not None:
        has = inter["user"].str.contains(users.lstrip("!"), regex=False)
        inter = inter[~has] if users.startswith("!") else inter[has]
    t = inter["completion_time"].dropna()
    if t.empty:
        return {
            "count": 0,
            "mean": float("nan"),
            "p50": float("nan"),
            "p90": float("nan"),
            "p99": float("nan"),
        }
    return {
        "count": int(t.shape[0]),
        "mean": float(t.mean()),
        "p50": float(t.quantile(0.5)),
        "p90": float(t.quantile(0.9)),
        "p99": float(t.quantile(0.99)),
    }
