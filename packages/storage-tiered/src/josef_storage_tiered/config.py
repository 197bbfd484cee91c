"""Reading a backend's settings: the broker's ``rsm.config.*`` keys, prefix removed, typed and checked.

Every error is a :class:`ValueError` that names the key as the operator
wrote it (``rsm.config.storage.s3.bucket.name``), since that is what they
grep their ``server.properties`` for. Keys a backend does not know are
ignored: the same prefix carries the keys of every other backend, and of
Aiven's RSM features josef has no use for (caches, encryption...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The broker's ``remote.log.storage.manager.impl.prefix`` default: what operators write before each key.
PREFIX = "rsm.config."

_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def full_key(key: str) -> str:
    """The key as it is written in server.properties."""
    return PREFIX + key


class Settings:
    """Typed reads of one backend's settings, with errors naming the full key."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self._settings = settings

    def _raw(self, key: str) -> Any:
        value = self._settings.get(key)
        if isinstance(value, str):
            value = value.strip()
            return value or None
        return value

    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        value = self._raw(key)
        if value is None:
            if required:
                raise ValueError(f"{full_key(key)} is required")
            return default
        return str(value)

    def required(self, key: str) -> str:
        value = self.string(key, required=True)
        assert value is not None
        return value

    def boolean(self, key: str, default: bool | None = None) -> bool | None:
        value = self._raw(key)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError(f"{full_key(key)}={value!r} is not a boolean (true or false)")

    def integer(self, key: str, default: int | None = None, *, minimum: int | None = None,
                maximum: int | None = None) -> int | None:
        value = self._raw(key)
        if value is None:
            return default
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{full_key(key)}={value!r} is not an integer") from None
        if minimum is not None and number < minimum or maximum is not None and number > maximum:
            bounds = f"at least {minimum}" if maximum is None else f"between {minimum} and {maximum}"
            raise ValueError(f"{full_key(key)}={number} must be {bounds}")
        return number
