"""Every command's entry point. The command's module (and with it numpy, pandas, Hydra, ...) is
imported only here, inside a guard: Ctrl-C while those imports load, a second or so, ends in one
line and exit status 130 like any other interrupt, not in a traceback of the import machinery."""

from __future__ import annotations

import importlib
import signal
import sys
from pathlib import Path

COMMANDS = {
    "fairsim": "simulator.apps.run.cli",
    "fairsim-vtc-tables": "simulator.apps.papers.vtc_tables",
    "fairsim-capacity": "simulator.apps.capacity.cli",
    "fairsim-trace-stats": "simulator.apps.data.trace_stats",
    "fairsim-fairserve-table": "simulator.apps.papers.fairserve_table",
    "fairsim-aggregate": "simulator.apps.sweeps.aggregate",
    "fairsim-data": "simulator.apps.data.download",
    "fairsim-validation": "simulator.apps.papers.validation",
    "fairsim-serve": "simulator.apps.live.serve",
    "fairsim-bench": "simulator.apps.measure.bench",
    "fairsim-calibrate": "simulator.apps.measure.calibrate",
    "fairsim-compare": "simulator.apps.measure.compare",
    "fairsim-policy-table": "simulator.apps.papers.policy_table",
    "fairsim-fit": "simulator.apps.sim2real.fit",
    "fairsim-sim2real": "simulator.apps.sim2real.report",
}


def main() -> None:
    """Run the command this script is installed as (its file name names it)."""
    prog = Path(sys.argv[0]).name
    if prog not in COMMANDS:
        sys.exit(f"fairsim: unknown command {prog!r}; the commands: {', '.join(COMMANDS)}")
    try:
        command = importlib.import_module(COMMANDS[prog])
    except KeyboardInterrupt:
        print(f"{prog}: interrupted (SIGINT)", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    command.main()
