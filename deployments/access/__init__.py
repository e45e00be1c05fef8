"""Access control: tenants, API keys as salted hashes, rate-limit buckets (no Ray, no HTTP)."""
