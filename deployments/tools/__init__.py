"""Command-line tools: the preflight check, the KubeRay manifest generator, port checks."""
