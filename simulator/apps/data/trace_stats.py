"""`fairsim-trace-stats PATH [--format NAME] [--plot FILE]`: what a trace file holds, as JSON
(traces/stats.py). A bad file is one line naming the file, line and field, and exit status 2."""

from __future__ import annotations

import argparse
import json

from simulator.apps.common.command import run_command
from traces.stats import FORMATS, describe


def main(argv: list[str] | None = None) -> None:
    run_command("fairsim-trace-stats", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    ap = argparse.ArgumentParser(prog="fairsim-trace-stats", description=__doc__.split("\n")[0])
    ap.add_argument("path")
    ap.add_argument("--format", choices=FORMATS, help="default: detected from the file")
    ap.add_argument("--plot", metavar="PNG", help="save arrival rate and length histograms")
    ap.add_argument("--sort", action="store_true", help="sort unsorted timestamps")
    ap.add_argument("--rate", type=float, default=5.0, help="servegen: target requests/s")
    ap.add_argument("--duration", type=float, default=3600.0, help="servegen: seconds")
    args = ap.parse_args(argv)
    stats = describe(args.path, args.format, args.plot, args.sort, args.rate, args.duration)
    print(json.dumps(stats))
