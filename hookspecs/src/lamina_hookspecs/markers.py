"""The pluggy markers for the ``lamina`` project name, created once."""

import pluggy

PROJECT_NAME = "lamina"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
