"""An example josef plugin: topic policies for the controller and an interceptor for josef-client's producer.

Everything josef sees is in :mod:`josef_topic_policy.plugin`, the module the
``josef`` entry point names.
"""

from josef_topic_policy.interceptor import ORIGIN_HEADER, OriginInterceptor
from josef_topic_policy.policy import TopicPolicy

__all__ = ["ORIGIN_HEADER", "OriginInterceptor", "TopicPolicy"]
