"""Chaos nights: the convergence soak (docs/design/soak.md)."""
