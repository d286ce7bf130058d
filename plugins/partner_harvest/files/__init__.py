"""File deliveries: partners that publish dated dumps and deltas (docs/design/files.md)."""
