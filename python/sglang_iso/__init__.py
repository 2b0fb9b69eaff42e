"""sglang-iso."""
