"""Kafka's API keys by name (``ApiKey.FETCH == 1``), made from kio's table so the two never disagree.

Names are kio's, upper-cased: Kafka's own ``ApiKeys`` enum spells them the same way.
"""

from __future__ import annotations

import enum

from kio.schema.index import api_key_map

ApiKey = enum.IntEnum("ApiKey", {name.upper(): key for key, name in sorted(api_key_map.items())})  # type: ignore[misc]
