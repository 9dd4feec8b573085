"""What the ``tools`` extra of ``lamina-core`` adds, and what a tool says when it is missing."""

from __future__ import annotations

import sys

TOOLS_EXTRA = ("httpx", "numpy", "rich", "tqdm")
"""The tools' own dependencies; serving imports none of them."""


def missing_tool(command: str, error: ModuleNotFoundError) -> int:
    """Say which package ``lamina <command>`` lacks and how to install it; re-raise any other missing module."""
    package = (error.name or "").split(".")[0]
    if package not in TOOLS_EXTRA:
        raise error
    print(f"error: lamina {command} needs {package}, which comes with the tools extra: "
          "pip install 'lamina-core[tools]'", file=sys.stderr)
    return 2
