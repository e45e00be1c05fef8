"""Text generation: a continuous-batching loop over a Hugging Face causal LM and its KV cache."""
