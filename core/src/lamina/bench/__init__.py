"""``lamina bench``: load-test OpenAI-compatible endpoints and compare stacks."""
