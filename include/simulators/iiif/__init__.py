"""A loopback IIIF Change Discovery 1.0 stream (Activity Streams 2.0) over a simulated museum."""
