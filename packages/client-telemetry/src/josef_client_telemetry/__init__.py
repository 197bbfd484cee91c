"""Client metrics (KIP-714) for josef: what Kafka clients push, kept per client and exported to Prometheus.

Installing this distribution makes every broker advertise the telemetry APIs
(GetTelemetrySubscriptions, PushTelemetry): librdkafka and the Java client
then push their metrics, and :class:`PrometheusTelemetryReceiver` keeps the
latest state of each client's series for the broker's ``/metrics`` endpoint.
"""

from josef_client_telemetry.receiver import PrometheusTelemetryReceiver

__all__ = ["PrometheusTelemetryReceiver"]
