"""Request-side stage code: parsing, validation and tokenization. Pure Python, no Ray or web framework."""
