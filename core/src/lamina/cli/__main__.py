"""``python -m lamina.cli`` is ``lamina``."""

from lamina.cli import main

raise SystemExit(main())
