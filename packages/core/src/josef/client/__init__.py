"""josef's Kafka client: asyncio-native producer, consumer and admin, with thin synchronous wrappers."""
