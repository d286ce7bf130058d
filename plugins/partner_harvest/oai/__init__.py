"""OAI-PMH adapter: protocol facts (parsing, errors, requests) live here."""
