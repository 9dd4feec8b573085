"""Lamina core: loads plugins, builds stacks from stack files, runs the request lifecycle."""

__version__ = "0.1.0"
