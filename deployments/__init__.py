"""Ray Serve deployments: thin adapters over the pure stage code in preprocess/, postprocess/ and here.

Import nothing here: ``deployments.repository.manifest`` and ``deployments.config`` must stay
importable without Ray.
"""
