"""Check a composed config before anything is built, so a bad value is named by its key.

Every node with a `_target_` is compared with the signature of what it builds: an unknown key,
a missing required value, or a value of the wrong kind (`engine.pool_tokens=10k` for an integer)
is a `ConfigError` that names the key and what is accepted. Values are only checked, never
converted: a config that passes builds exactly what it did before.
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from collections.abc import Iterator
from typing import Any, TypeVar

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from simulator.core.errors import ConfigError

# top-level keys of conf/config.yaml with a fixed kind
TOP_LEVEL_KINDS = {
    "seed": int,
    "progress": bool,
    "veeksha_metrics": bool,
    "pictures": bool,
    "replications": int,
    "replicate_workload": bool,
}
KIND_NAMES = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    list: "a list",
    dict: "a mapping",
}
# annotations a config value's kind is read from: a sequence is given as a list, a mapping as one
CONTAINERS: dict[Any, type] = {
    list: list,
    tuple: list,
    collections.abc.Sequence: list,
    dict: dict,
    collections.abc.Mapping: dict,
}
NONE = type(None)
T = TypeVar("T")


def check_config(cfg: DictConfig) -> None:
    """Raise a ConfigError naming the first key whose value cannot be used (and an omegaconf
    MissingMandatoryValue, naming its key, for a `???` left unset)."""
    plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(plain, dict)
    for key, kind in TOP_LEVEL_KINDS.items():
        if key in plain and not _is_kind(plain[key], kind):
            raise ConfigError(f"{key}={plain[key]!r}: expected {KIND_NAMES[kind]}")
    _check_seed("seed", plain.get("seed"))
    for key in ("replications", "replication_jobs", "console_rows"):
        value = plain.get(key)
        if value is not None and (not _is_kind(value, int) or value < 1):
            raise ConfigError(f"{key}={value!r}: expected an integer >= 1 (or null)")
    for path, node in _target_nodes(plain, ""):
        _check_node(path, node)
        for key, value in node.items():
            if key == "seed" or key.endswith("_seed"):
                _check_seed(f"{path}.{key}", value)


def build_block(cfg: DictConfig, name: str, cls: type[T]) -> T:
    """A plain block of the config (`serve:`, `target:`) as the dataclass that reads it, with
    an unknown key or a value of the wrong kind named like any other setting."""
    plain: Any = OmegaConf.to_container(cfg[name], resolve=True, throw_on_missing=True)
    if not isinstance(plain, dict):
        raise ConfigError(f"{name}={plain!r}: expected a mapping of settings")
    _check_node(name, {"_target_": f"{cls.__module__}.{cls.__qualname__}", **plain})
    return cls(**plain)


def _check_seed(key: str, value: Any) -> None:
    """Seeds seed numpy's generators, which take integers >= 0."""
    if value is not None and (not _is_kind(value, int) or value < 0):
        raise ConfigError(f"{key}={value!r}: expected an integer >= 0 (a random seed)")


def _target_nodes(value: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(value, dict):
        if "_target_" in value:
            yield path, value
        for key, v in value.items():
            yield from _target_nodes(v, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _target_nodes(v, f"{path}[{i}]")


def _check_node(path: str, node: dict[str, Any]) -> None:
    target_name = node["_target_"]
    try:
        target = get_object(target_name)
    except Exception:
        raise ConfigError(f"{path}._target_: cannot import {target_name!r}") from None
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return  # a builtin without a signature: nothing to check against
    open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = {n: p for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    given = {k: v for k, v in node.items() if not k.startswith("_")}
    unknown = sorted(set(given) - set(named))
    if unknown and not open_ended:
        raise ConfigError(
            f"{path}.{unknown[0]}: not a setting of {target_name}; accepted: {sorted(named)}"
        )
    for name, p in named.items():
        if p.default is p.empty and name not in given and p.kind is not p.POSITIONAL_ONLY:
            raise ConfigError(f"{path}.{name} has no value; give one, e.g. {path}.{name}=...")
    hints = _type_hints(target)
    for name, value in given.items():
        kinds, nullable = _simple_kinds(hints.get(name))
        if not kinds or (value is None and nullable):
            continue
        if value is None or not any(_is_kind(value, k) for k in kinds):
            accepted = " or ".join(KIND_NAMES[k] for k in kinds) + (" or null" if nullable else "")
            raise ConfigError(f"{path}.{name}={value!r}: expected {accepted}")


def _type_hints(target: Any) -> dict[str, Any]:
    """The annotated types of the target's parameters; {} where they cannot be evaluated."""
    try:
        return typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    except Exception:
        return {}


def _simple_kinds(annotation: Any) -> tuple[tuple[type, ...], bool]:
    """(the kinds a value may have: int, float, bool, str, list or dict; whether None is
    allowed) when the annotation allows only those; ((), True) when it allows anything else
    (a class, Any), which is then not checked here. Elements of lists and mappings are not
    checked here either."""
    if annotation is None:
        return (), True
    args = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    kinds = tuple(CONTAINERS.get(typing.get_origin(a) or a, a) for a in args if a is not NONE)
    if not kinds or not all(k in KIND_NAMES for k in kinds):
        return (), True
    return kinds, len(kinds) < len(args)


def _is_kind(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is int:
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if kind is float:
        return isinstance(value, (int, float))
    if kind in (list, dict):
        return isinstance(value, kind)
    return isinstance(value, (str, int, float))  # a string: Hydra parses `123` as a number
