"""Transports: the OpenAI-compatible HTTP API (and, later, gRPC) over a built stack."""
