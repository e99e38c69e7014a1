"""Durations in the configuration and on the command line: ``300``, ``300s``, ``5m``, ``2h``, ``1d``.

The one parser, for the settings (gitlease.core.config) and the commit hook (which reads ``lease.skew`` itself,
cheaply). Standard library only, and imports nothing but the errors.
"""

from __future__ import annotations

from gitlease.core.errors import ConfigError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(name: str, value: str | None, default: int, lo: int, hi: int) -> int:
    """``value`` in seconds (``default`` when unset or empty), between ``lo`` and ``hi``; else ConfigError naming
    ``name``."""
    if value is None or value == "":
        return default
    text = value.strip().lower()
    mult = 1
    if text and text[-1] in _UNITS:
        text, mult = text[:-1], _UNITS[text[-1]]
    try:
        n = int(text) * mult
    except ValueError:
        raise ConfigError(f"{name} must be a duration (300, 300s, 5m, 2h, 1d), not {value!r}") from None
    if not lo <= n <= hi:
        raise ConfigError(f"{name} must be between {lo} and {hi} seconds, not {n}")
    return n
