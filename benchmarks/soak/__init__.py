"""Chaos nights: the convergence soak (README, "Chaos nights (the soak)")."""
