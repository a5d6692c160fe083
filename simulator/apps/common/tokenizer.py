"""A tokenizer plugged in by name ("module:function"), for `fairsim-serve` and `fairsim-bench`."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from simulator.core.errors import ConfigError


def load_tokenizer(spec: str, key: str) -> Callable[[str], int]:
    """A function from text to its token count, made from `spec`: "module:function" naming a
    function that returns the text's token count or its token ids (e.g. a wrapper around
    tiktoken's or Hugging Face's encode). `key` is the setting that named it, for errors."""
    module, _, name = spec.partition(":")
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigError(f"{key}={spec!r}: {err}; accepted: 'module:function'") from None
    if not callable(function):
        raise ConfigError(f"{key}={spec!r} is not callable")

    def count(text: str) -> int:
        out = function(text)
        return int(out) if isinstance(out, int) else len(out)

    return count
