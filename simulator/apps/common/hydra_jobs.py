"""Multirun sweeps: job folders named by their overrides, resumable, failures recorded.

Each job of `fairsim -m ...` runs in `<sweep dir>/<overrides>/seed=<seed>/` (the overrides
without the seed, `default` when only the seed varies). A job's folder says in `job.json` how it
went (simulator/report/run_folder.py): `{"status": "completed", "config_digest": ...}` after it
wrote every output, or `failed` with the error and traceback (its config is in
`.hydra/config.yaml`), or `interrupted`.
Re-running a sweep into the same `hydra.sweep.dir` skips every job whose folder says completed
for the same configuration digest. At the end, `SweepReport` prints the counts, writes
`jobs.csv` beside the job folders, and exits 1 if any job failed.
"""

from __future__ import annotations

import difflib
import logging
import re
import shutil
import socket
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

import conf
from simulator.api.config_check import check_config
from simulator.api.inert_settings import inert_overrides, override_key
from simulator.apps.common.command import (
    Interrupted,
    RunFailed,
    input_error_message,
    run_command,
    signals_interrupt,
)
from simulator.core.errors import ConfigError
from simulator.report.run_folder import (
    STATUS_FILE,
    config_digest,
    is_completed,
    mark_completed,
    mark_orphaned_jobs,
    mark_running,
    mark_status,
    read_status,
)


def run_job(
    prog: str,
    cfg: DictConfig,
    out_dir: str,
    job: Callable[[], None],
    unread: Mapping[str, str] | None = None,
    inert: Mapping[str, str] | None = None,
) -> None:
    """Run one `prog` job in its folder, which says in job.json how it went (running, then
    completed, failed with the error and traceback, or interrupted). Alone, a failure is raised
    for `command.run_command` to report. In a multirun, skip the job if its folder already
    completed this configuration, and record a failure instead of stopping the sweep.
    `unread`: top-level keys of the shared config that `prog` does not read, each with why;
    setting one on the command line is an input error (`check_unread_keys`). `inert`: key
    prefixes this configuration of `prog` leaves unread, each with why; setting one gets a
    note, as the blocks `inert_overrides` knows do."""
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    # Hydra sends INFO records to stdout: matplotlib's notes (it built its font cache) are
    # not the command's output
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    digest = config_digest(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    if multirun and is_completed(out_dir, digest):
        print(f"{prog}: skipped, already completed: {out_dir}")
        return
    try:
        with signals_interrupt():  # a sweep's worker process marks its job too
            mark_running(out_dir, digest)
            check_added_keys(cfg)
            check_unread_keys(unread or {})
            check_config(cfg)
            job()
    except (KeyboardInterrupt, Interrupted) as err:
        name = err.signal_name if isinstance(err, Interrupted) else "SIGINT"
        discard_temporaries(Path(out_dir))
        mark_status(out_dir, "interrupted", config_digest=digest, signal=name)
        raise
    except Exception as err:
        record_failure(out_dir, err, digest)
        if not multirun:
            if input_error_message(err) is not None:
                discard_if_unused(Path(out_dir))
            raise RunFailed(out_dir, err) from err
        line = input_error_message(err) or f"internal error: {type(err).__name__}: {err}"
        print(f"{prog}: job failed: {line} (recorded in {out_dir}/{STATUS_FILE})", file=sys.stderr)
    else:
        mark_completed(out_dir, digest)
        # after the run, not before: an input error found while building it is then the one
        # line printed, and a finished run's last lines say what it did not read
        for note in inert_overrides(cfg, HydraConfig.get().overrides.task, inert):
            print(f"{prog}: note: {note}", file=sys.stderr)


BOOKKEEPING = (STATUS_FILE, ".hydra")  # and Hydra's job log, `<command>.log`


def discard_if_unused(folder: Path) -> None:
    """A single run refused for its input before it wrote anything leaves no folder behind
    (the console line says what was wrong): the folder goes, and so do the parents it leaves
    empty inside the working directory (`outputs/<date>/`)."""
    if any(p.name not in BOOKKEEPING and p.suffix != ".log" for p in folder.iterdir()):
        return  # something was written: the folder stays, marked failed
    shutil.rmtree(folder, ignore_errors=True)
    here = Path.cwd().resolve()
    parent = folder.resolve().parent
    while parent != here and here in parent.parents and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


def discard_temporaries(folder: Path) -> None:
    """What a stopped run leaves half-made: the step records a large run spills (`.spill/`)
    and files not yet renamed into place (`*.tmp`). No run resumes from them."""
    shutil.rmtree(folder / ".spill", ignore_errors=True)
    for partial in folder.rglob("*.tmp"):
        partial.unlink(missing_ok=True)


def check_added_keys(cfg: DictConfig) -> None:
    """A `+key=value` that adds a top-level key is refused: no command reads a key its config
    does not declare, so it would be ignored silently (`+seeed=3`). Keys added inside a block
    (`+workload.clients.0.arrival.cv=3`) are checked against what the block builds; `+group=x`
    selects a config group."""
    groups = HydraConfig.get().runtime.choices
    for override in HydraConfig.get().overrides.task:
        if not override.startswith("+") or override.startswith("++"):
            continue
        key = override[1:].split("=", 1)[0]
        if "." in key or "/" in key or key in groups:
            continue
        accepted = sorted(str(k) for k in cfg if k not in (key, "hydra"))
        raise ConfigError(f"{key}: not a setting of this command; accepted: {accepted}")


def check_unread_keys(unread: Mapping[str, str]) -> None:
    """A key the command inherits from config.yaml but never reads, set on its command line
    (`fairsim-serve workload=...`), is refused with why: it would be ignored silently."""
    for override in HydraConfig.get().overrides.task:
        key = override_key(override)
        top = re.split(r"[./]", key, maxsplit=1)[0]
        if top in unread:
            raise ConfigError(f"{key}: {unread[top]}")


def record_failure(folder: str | Path, err: BaseException, digest: str) -> None:
    message = input_error_message(err)
    mark_status(
        folder,
        "failed",
        config_digest=digest,
        error=message if message is not None else f"{type(err).__name__}: {err}",
        kind="input error" if message is not None else "internal error",
        traceback="".join(traceback.format_exception(err)),
    )


def job_subdir(override_dirname: str, seed: Any) -> str:
    """`<overrides>/seed=<seed>`: the seed gets its own level so seeds of one setting sit
    together."""
    return f"{override_dirname or 'default'}/seed={seed}"


if not OmegaConf.has_resolver("fairsim_job_subdir"):  # used by conf/config.yaml's hydra.sweep
    OmegaConf.register_new_resolver("fairsim_job_subdir", job_subdir)


def job_folders(sweep_dir: str | Path) -> list[Path]:
    """Every job folder (one with Hydra's `.hydra/`) under `sweep_dir`, in name order."""
    return sorted(p.parent for p in Path(sweep_dir).glob("**/.hydra"))


def job_table(sweep_dir: str | Path) -> list[dict[str, str]]:
    """Every job folder under `sweep_dir`, with its status."""
    rows = []
    for folder in job_folders(sweep_dir):
        job = read_status(folder) or {"status": "unfinished"}
        rows.append(
            {
                "job": str(folder.relative_to(sweep_dir)),
                "status": str(job.get("status")),
                "error": str(job.get("error", "")),
            }
        )
    return rows


# the sweep folders this process has launched jobs into (SweepReport.on_multirun_start)
_SWEEPS_STARTED: list[Path] = []


def run_hydra_command(prog: str, hydra_main: Callable[[], None]) -> None:
    """`run_command` for a Hydra app. When SIGINT or SIGTERM stops a sweep, the launcher may have
    ended a worker before it marked its job interrupted; those folders are marked here, so no
    folder says running when nothing runs it."""

    def entry() -> None:
        try:
            hydra_main()
        except SweepRefused as refused:
            raise refused.error from None
        except (KeyboardInterrupt, Interrupted) as err:
            name = err.signal_name if isinstance(err, Interrupted) else "SIGINT"
            for sweep_dir in _SWEEPS_STARTED:
                mark_orphaned_jobs(sweep_dir, name)
            raise
        except OSError as err:
            for setting in ("hydra.run.dir", "hydra.sweep.dir"):
                given = next((a.split("=", 1)[1] for a in sys.argv if a.startswith(setting)), None)
                if given and err.filename and str(err.filename).startswith(given):
                    raise ConfigError(
                        f"{setting}={given}: cannot make the run folder there "
                        f"({err.strerror or err}); accepted: a folder you can write to"
                    ) from None
            raise
        except ValueError as err:  # Hydra's own words for `group=null` name no group
            if "Config group override must be" not in str(err):
                raise
            raise ConfigError(null_group_message()) from None
        except ConfigCompositionException as err:
            found = re.match(r"Could not override '([^']+)'", str(err))
            message = unknown_key_message(prog, found.group(1)) if found else None
            if message is None:
                raise
            raise ConfigError(message) from None

    run_command(prog, entry)


CONF_DIR = Path(conf.__file__).parent
COMMAND_CONFIGS = {"fairsim": "config", "fairsim-serve": "serve", "fairsim-bench": "bench",
                   "fairsim-capacity": "capacity"}  # fmt: skip


def null_group_message() -> str:
    """For `group=null` on the command line: a config group takes one of its configs, and
    `~group` leaves it out."""
    for arg in sys.argv[1:]:
        group, _, value = arg.partition("=")
        if value.lower() in ("null", "none", "~") and (CONF_DIR / group).is_dir():
            options = ", ".join(sorted(f.stem for f in (CONF_DIR / group).glob("*.yaml")))
            return (
                f"{arg}: {group} is a config group; accepted: one of its configs ({options}), "
                f"or ~{group} to run without it"
            )
    return "a config group was set to null; accepted: one of its configs, or ~GROUP"


def unknown_key_message(prog: str, key: str) -> str | None:
    """For `key=value` naming no setting: the settings of its block (composed from the same
    command line without it), the closest one, and the other configs of the group that have
    such a setting (`policy.limit` belongs to `policy=rpm`). None if it cannot be told."""
    args = [a for a in sys.argv[1:] if not a.startswith("-") and not a.startswith(f"{key}=")]
    parent, _, leaf = key.rpartition(".")
    try:
        from simulator.api.run import compose_config

        cfg = compose_config(args, COMMAND_CONFIGS[prog])
        block = OmegaConf.select(cfg, parent) if parent else cfg
    except Exception:  # noqa: BLE001 - any failure: keep Hydra's own message
        return None
    if not isinstance(block, DictConfig):
        return None
    settings = sorted(str(k) for k in block if k not in ("_target_", "hydra"))
    if isinstance(block.get(leaf), DictConfig):  # a mapping of settings, empty by default
        return f"{key}: a mapping; add its entries one at a time with +, e.g. +{key}.NAME=VALUE"
    close = difflib.get_close_matches(leaf, settings, n=1)
    hint = f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""
    owners = sorted(
        f"{parent}={f.stem}"
        for f in (CONF_DIR / parent).glob("*.yaml")
        if parent and "." not in parent and leaf in (OmegaConf.load(f) or {})
    )
    elsewhere = f"; {leaf} is a setting of {', '.join(owners)}" if owners else ""
    return f"{key}: not a setting of {parent or prog}{hint}; accepted: {settings}{elsewhere}"


class SweepRefused(BaseException):
    """A sweep stopped before its first job for an input error (`error`): Hydra turns an
    Exception raised by a callback into a warning and goes on, so it travels as this."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__(str(error))
        self.error = error


RAY_ANSWER_S = 5.0  # seconds a Ray cluster's address gets to accept a connection


def check_ray_cluster(launcher: DictConfig) -> None:
    """A sweep sent to a Ray cluster at HOST:PORT that nothing answers fails at once, saying so
    (Ray itself retries for minutes, silently)."""
    address = OmegaConf.select(launcher, "ray.init.address", default=None)
    if not isinstance(address, str) or ":" not in address or "://" in address:
        return  # none (Ray starts its own), "auto", or a client URL: Ray's own checks
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ConfigError(
            f"hydra.launcher.ray.init.address={address}: accepted: HOST:PORT of a Ray head, or auto"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_ANSWER_S).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ConfigError(
            f"hydra.launcher.ray.init.address={address}: no Ray cluster answers there "
            f"({reason}); start one (ray start --head) or use hydra/launcher=ray_local"
        ) from None


class SweepReport(Callback):
    """Hydra callback: after a multirun, count its jobs and fail loudly if any failed."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_ray_cluster(config.hydra.launcher)
        except ConfigError as err:
            raise SweepRefused(err) from None
        _SWEEPS_STARTED.append(Path(config.hydra.sweep.dir))

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
