"""The model repository: manifests, resolving a configured model, checking its weights."""
