"""Tools around a running stack, none of which serving needs: ``bench`` (load tests and A/B
comparisons of stacks), ``status`` (one screen on a live server), ``ab_report`` (per-arm
statistics with confidence intervals), ``autoscale_replay`` (autoscalers against a simulated pool),
``client`` (a Python client that streams with any codec), ``htmlreport`` (the reports' HTML and SVG).

They use the kernel's, the pool's and the servers' public names; nothing in those imports a tool.
Their dependencies come with the ``tools`` extra of ``lamina-core``.
"""
