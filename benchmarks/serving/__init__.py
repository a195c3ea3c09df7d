"""Serving: many requests at once (batch rows, concurrent clients, the prompt cache) and what fits in memory."""
