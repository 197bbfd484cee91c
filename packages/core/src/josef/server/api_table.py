"""The table of Kafka APIs a broker answers, beside the versions Kafka defines, for the core's README.

The "Kafka" column is the version range of each API in the message
definitions kio is generated from (Apache Kafka's current definitions, which
already drop the versions Kafka 4.0 removed, KIP-896); the "broker" and
"controller" columns are what a combined josef node registered on its client
listeners and on its controller listeners, which is what ApiVersions
advertises on each. The
README's copy is checked against the code by a test, so it cannot drift::

    python -m josef.server.api_table     # print the table for the installed plugins
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Mapping

from kio.schema.index import api_key_map, schema_name_map

from josef.server.dispatch import Api

#: The markers around the generated table in packages/core/README.md.
BEGIN, END = "<!-- api-table:begin -->", "<!-- api-table:end -->"


def _range(low: int, high: int) -> str:
    return f"{low}" if low == high else f"{low}-{high}"


def _title(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _ours(apis: Mapping[int, Api], key: int) -> str:
    api = apis.get(key)
    return _range(api.min_version, api.max_version) if api is not None else "—"


def _count(apis: Mapping[int, Api]) -> str:
    return f"{len(apis)} of {len(api_key_map)} APIs, {sum(a.max_version - a.min_version + 1 for a in apis.values())} API versions"


def render(broker: Mapping[int, Api], controller: Mapping[int, Api]) -> str:
    """The markdown table of every API key kio knows, with josef's ranges on each kind of listener or a dash."""
    lines = ["| key | API | Kafka | josef broker | josef controller |", "| ---: | --- | --- | --- | --- |"]
    for key in sorted(api_key_map):
        versions = schema_name_map[api_key_map[key]]
        lines.append(f"| {key} | {_title(api_key_map[key])} | {_range(min(versions), max(versions))} "
                     f"| {_ours(broker, key)} | {_ours(controller, key)} |")
    lines.append("")
    lines.append(f"Client listeners: {_count(broker)}. Controller listeners: {_count(controller)}.")
    return "\n".join(lines)


def readme_table(readme: str) -> str:
    """The table between the markers of a README's text."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[start:end].strip()


def installed_apis() -> tuple[Mapping[int, Api], Mapping[int, Api]]:
    """What a default node with the installed plugins registers on client and controller listeners (started briefly)."""
    from josef.node.runner import BrokerThread

    with tempfile.TemporaryDirectory() as scratch:
        overrides = {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": str(Path(scratch) / "logs")}
        with BrokerThread(overrides) as thread:
            assert thread.broker is not None
            return dict(thread.broker.dispatcher.apis), dict(thread.broker.controller_dispatcher.apis)


if __name__ == "__main__":
    sys.stdout.write(render(*installed_apis()) + "\n")
