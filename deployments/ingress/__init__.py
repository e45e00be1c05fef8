"""Where a request enters: the HTTP ingress, its error mapping, admission and routing to a model."""
