"""``lamina bench``: seeded workloads, the load generator, metrics and reports (the command's
arguments in :mod:`lamina.cli.bench`)."""
