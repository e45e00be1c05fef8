"""The generation engine's tiny models, shared by test_generate_engine.py and test_generate_limits.py."""

from tests.unit.deployments.runtime.generate_support import gpt2, llama, one_thread

__all__ = ["gpt2", "llama", "one_thread"]
