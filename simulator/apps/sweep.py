"""Multirun sweeps: job folders named by their overrides, resumable, failures recorded.

Each job of `fairsim -m ...` runs in `<sweep dir>/<overrides>/seed=<seed>/` (the overrides
without the seed, `default` when only the seed varies). A job leaves `job.json` in its folder:
`{"status": "completed", "config_digest": ...}` after it wrote every output, or
`{"status": "failed", "error": ..., "traceback": ...}` (its config is in `.hydra/config.yaml`).
Re-running a sweep into the same `hydra.sweep.dir` skips every job whose folder says completed
for the same configuration digest. At the end, `SweepReport` prints the counts, writes
`jobs.csv` beside the job folders, and exits 1 if any job failed.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from simulator.report.run_folder import config_digest
from traces.schema import TraceError

JOB_FILE = "job.json"


class UserError(Exception):
    """Bad input (config, trace, impossible request): printed as one line, exit status 2."""


USER_ERRORS = (InstantiationException, TraceError, ValueError, FileNotFoundError)


def user_error(err: BaseException) -> UserError:
    """The message a user should see: Hydra's instantiation wrapper hides the real cause."""
    cause = err.__cause__ if isinstance(err, InstantiationException) and err.__cause__ else err
    return UserError(str(cause))


def run_job(prog: str, cfg: DictConfig, out_dir: str, job: Callable[[], None]) -> None:
    """Run one `prog` job. Alone: bad input exits 2 with its message. In a multirun: skip the
    job if its folder already completed this configuration, and record a failure in `job.json`
    instead of stopping the sweep."""
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        try:
            job()
        except USER_ERRORS as err:
            print(f"{prog}: error: {user_error(err)}", file=sys.stderr)
            sys.exit(2)
        return
    digest = config_digest(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    if is_completed(out_dir, digest):
        print(f"{prog}: skipped, already completed: {out_dir}")
        return
    try:
        job()
    except USER_ERRORS as err:
        _failed(prog, out_dir, user_error(err))
    except Exception as err:  # a sweep records any failure and goes on
        _failed(prog, out_dir, err)
    else:
        record_completed(out_dir, digest)


def _failed(prog: str, out_dir: str, err: BaseException) -> None:
    record_failure(out_dir, err)
    print(f"{prog}: job failed: {err} (recorded in {out_dir}/{JOB_FILE})", file=sys.stderr)


def job_subdir(override_dirname: str, seed: Any) -> str:
    """`<overrides>/seed=<seed>`: the seed gets its own level so seeds of one setting sit
    together."""
    return f"{override_dirname or 'default'}/seed={seed}"


if not OmegaConf.has_resolver("fairsim_job_subdir"):  # used by conf/config.yaml's hydra.sweep
    OmegaConf.register_new_resolver("fairsim_job_subdir", job_subdir)


def read_job(folder: str | Path) -> dict[str, Any] | None:
    path = Path(folder, JOB_FILE)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None  # a job killed while writing: run it again
    return data if isinstance(data, dict) else None


def is_completed(folder: str | Path, digest: str) -> bool:
    job = read_job(folder) or {}
    return job.get("status") == "completed" and job.get("config_digest") == digest


def record_completed(folder: str | Path, digest: str) -> None:
    _write(folder, {"status": "completed", "config_digest": digest})


def record_failure(folder: str | Path, err: BaseException) -> None:
    _write(
        folder,
        {
            "status": "failed",
            "error": str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}",
            "traceback": "".join(traceback.format_exception(err)),
        },
    )


def _write(folder: str | Path, data: dict[str, Any]) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    tmp = Path(folder, JOB_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(Path(folder, JOB_FILE))  # atomic: a reader never sees half a file


def job_folders(sweep_dir: str | Path) -> list[Path]:
    """Every job folder (one with Hydra's `.hydra/`) under `sweep_dir`, in name order."""
    return sorted(p.parent for p in Path(sweep_dir).glob("**/.hydra"))


def job_table(sweep_dir: str | Path) -> list[dict[str, str]]:
    """Every job folder under `sweep_dir`, with its status."""
    rows = []
    for folder in job_folders(sweep_dir):
        job = read_job(folder) or {"status": "unfinished"}
        rows.append(
            {
                "job": str(folder.relative_to(sweep_dir)),
                "status": str(job.get("status")),
                "error": str(job.get("error", "")),
            }
        )
    return rows


class SweepReport(Callback):
    """Hydra callback: after a multirun, count its jobs and fail loudly if any failed."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = job_table(sweep_dir)
        if not rows:
            return
        pd.DataFrame(rows).to_csv(sweep_dir / "jobs.csv", index=False)
        counts = Counter(r["status"] for r in rows)
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        print(f"fairsim sweep {sweep_dir}: {len(rows)} jobs: {summary}", file=sys.stderr)
        failed = [r for r in rows if r["status"] != "completed"]
        for r in failed:
            print(f"  {r['status']}: {r['job']}: {r['error']}", file=sys.stderr)
        if failed:
            raise SystemExit(1)
