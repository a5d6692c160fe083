"""`fairsim-data`: the public data fairsim does not ship, fetched into the user's cache.

    fairsim-data list                 what can be fetched, its size and licence, and what is
                                      installed
    fairsim-data get NAME [NAME...]   download, verify (size and SHA-256) and install datasets
    fairsim-data get --all
    fairsim-data where                the folders `data:` paths are looked up in, in order

`--mirror URL` fetches from a mirror of the upstream repositories instead of GitHub (the
upstream path is appended to URL). The cache is $XDG_CACHE_HOME/fairsim/data (default
~/.cache/fairsim/data); FAIRSIM_DATA_DIR names a folder looked up before it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from simulator.apps.common.command import run_command
from simulator.core.errors import ConfigError
from traces.datasets import RemoteFile, dataset, datasets, fetch, is_installed
from traces.files import data_cache, data_dirs


def main(argv: list[str] | None = None) -> None:
    run_command("fairsim-data", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="fairsim-data", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="datasets that can be fetched")
    get = sub.add_parser("get", help="download and verify datasets into the cache")
    get.add_argument("names", nargs="*", help="dataset names (see `fairsim-data list`)")
    get.add_argument("--all", action="store_true", help="every dataset")
    get.add_argument("--mirror", help="a mirror of raw.githubusercontent.com to fetch from")
    sub.add_parser("where", help="the folders data: paths are looked up in")
    args = parser.parse_args(argv)
    cache = data_cache()
    if args.command == "list":
        for ds in datasets().values():
            state = "installed" if is_installed(ds, cache) else "not installed"
            print(
                f"{ds.name:<16}{len(ds.files):>4} files {ds.size / 1e6:>7.1f} MB  {ds.licence:<11}"
                f"{state:<15}{ds.source}"
            )
        print(f"cache: {cache}")
    elif args.command == "where":
        for folder in data_dirs():
            print(folder)
    else:
        names = sorted(datasets()) if args.all else args.names
        if not names:
            raise ConfigError("fairsim-data get: name a dataset (see `fairsim-data list`) or --all")
        for name in names:
            ds = dataset(name)
            written = fetch(ds, cache, args.mirror, _progress(ds.name, len(ds.files)))
            print(f"{name}: {'installed' if written else 'already installed'} in {cache / name}")


def _progress(name: str, total: int) -> Callable[[RemoteFile, int], None]:
    def report(remote: RemoteFile, done: int) -> None:
        print(f"{name}: {done}/{total} {remote.path}", file=sys.stderr, flush=True)

    return report
