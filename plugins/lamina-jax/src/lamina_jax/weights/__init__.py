"""Readers that turn model files into a configuration and parameters."""
