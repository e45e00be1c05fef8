"""The router's call to a model's pipeline replica on the same host, over a Unix socket (Serve's handle
otherwise)."""
