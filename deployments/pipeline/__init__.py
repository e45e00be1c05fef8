"""Where a batch forms: each model's tokenizer, batched inference and serializer deployments."""
