"""What every layer shares: the service's error taxonomy (``errors``) and the messages between stages
(``tokenized``: tokenize → inference, ``outputs``: inference → serialize → ingress).

It imports nothing from ``preprocess``, ``postprocess`` or ``deployments``, nor Ray, FastAPI or torch, so
every layer may import it and none depends on another through it.
"""
