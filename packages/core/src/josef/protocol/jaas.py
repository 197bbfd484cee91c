"""Kafka's JAAS configuration entries (``sasl.jaas.config``), read the same way by brokers and clients.

A broker's listener lists its users there (``PlainLoginModule required
user_alice="..."``), a client or a broker connecting to another broker its
own user name and password (``username="..." password="..."``). Values may
be quoted, with backslash escapes, or bare.
"""

from __future__ import annotations

import re

from josef.config import ConfigError

_JAAS = re.compile(r"\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)(?P<options>.*?);\s*$", re.S)
_OPTION = re.compile(r'\s*(?P<key>[\w.\-]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;]+))')


def parse_jaas(text: str, key: str) -> tuple[str, dict[str, str]]:
    """The login module and options of one JAAS entry (``Module required a="b" c="d";``).

    ``key`` names the configuration key in errors, never the value (it holds passwords).
    """
    match = _JAAS.fullmatch(text)
    if match is None:
        raise ConfigError(f"{key}: not a JAAS login module entry (expected: LoginModule required key=\"value\" ...;)")
    options: dict[str, str] = {}
    rest = match["options"]
    pos = 0
    while rest[pos:].strip():
        option = _OPTION.match(rest, pos)
        if option is None:
            raise ConfigError(f"{key}: cannot read the options of {match['module']} (expected key=\"value\" pairs)")
        quoted = option["quoted"]
        options[option["key"]] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else option["bare"]
        pos = option.end()
    return match["module"], options
