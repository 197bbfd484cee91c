"""Tiered storage's remote log metadata (KIP-405's topic-based ``RemoteLogMetadataManager``): the records of
``__remote_log_metadata`` and what they say about each partition's remote segments.

They live in the core, as in Kafka's ``storage`` module, because more than
the brokers read them: josef-storage-tiered keeps them on the brokers,
josef-client's tools (``josef log-dirs describe --remote``) and josef-spark's
direct remote reads learn from them what remote storage holds, and no
package may import a plugin.
"""

#: The internal topic the records are kept in.
TOPIC = "__remote_log_metadata"
