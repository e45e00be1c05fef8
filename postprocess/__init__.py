"""Response-side stage code: payload building and serialization. Pure Python, no Ray or web framework."""
