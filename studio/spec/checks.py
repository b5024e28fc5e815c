"""Validation helpers shared by the spec records: every error names the owner, the field, the value and the fix."""

from __future__ import annotations

import math
from dataclasses import asdict, fields


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field, the value and what is allowed."""


def fail(owner: str, name: str, value, allowed: str) -> None:
    raise ConfigError(f"{owner}.{name}={value!r} is not valid: {allowed}")


def check_choice(owner, name, value, choices):
    if value not in choices:
        fail(owner, name, value, f"use one of {list(choices)}")


def check_int(owner, name, value, lo=None, hi=None):
    if isinstance(value, bool) or not isinstance(value, int):
        fail(owner, name, value, "must be an integer")
    if lo is not None and value < lo:
        fail(owner, name, value, f"must be >= {lo}")
    if hi is not None and value > hi:
        fail(owner, name, value, f"must be <= {hi}")


def check_float(owner, name, value, lo=None, hi=None, allow_none=False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        fail(owner, name, value, "must be a finite number" + (" or null" if allow_none else ""))
    if lo is not None and value < lo:
        fail(owner, name, value, f"must be >= {lo}")
    if hi is not None and value > hi:
        fail(owner, name, value, f"must be <= {hi}")


def check_bool(owner, name, value, allow_none=False):
    if value is None and allow_none:
        return
    if not isinstance(value, bool):
        fail(owner, name, value, "must be true or false" + (" or null" if allow_none else ""))


class Record:
    """Mixin for the spec dataclasses: their field names are the YAML/JSON keys."""

    def as_dict(self) -> dict:
        return asdict(self)  # type: ignore[arg-type]

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]  # type: ignore[arg-type]


def parse_switch(value, what: str = "switch") -> bool | None:
    """A per-request switch: True/False, or None to follow the preset. Accepts 'true'/'false'/'unset' too."""
    if value is None or isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("", "unset", "none", "null", "preset", "follow preset"):
        return None
    if v in ("true", "on", "1", "yes"):
        return True
    if v in ("false", "off", "0", "no"):
        return False
    raise ConfigError(f"{what} {value!r} is not valid: use true, false, or leave it unset to follow the preset")
