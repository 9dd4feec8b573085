"""The decoder model: its configuration and its jittable forward pass."""
