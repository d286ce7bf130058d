"""IIIF Change Discovery API 1.0 (W3C Activity Streams 2.0): the third protocol."""
