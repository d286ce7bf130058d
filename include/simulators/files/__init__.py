"""A partner that publishes dated file deliveries: the publisher and an HTTP directory server."""
