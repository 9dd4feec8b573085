"""Logging: JSON lines off a TTY, stdlib loggers through the same formatter, no frame locals."""

from __future__ import annotations

import json
import logging
import re

import pytest
import structlog
from lamina.kernel.logging import configure_logging

pytestmark = pytest.mark.usefixtures("restore_logging")


def test_json_lines_for_structlog_and_stdlib_without_locals(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=True)
    secret = "sk-very-secret"  # noqa: F841 - a local that must not be rendered
    try:
        raise ValueError("bad")
    except ValueError:
        structlog.get_logger("lamina.test").exception("request_failed", request_id="r1")
    logging.getLogger("grpc").warning("from stdlib")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines[0]["event"] == "request_failed" and lines[0]["request_id"] == "r1"
    assert "ValueError" in json.dumps(lines[0]["exception"]) and "sk-very-secret" not in json.dumps(lines[0])
    assert lines[1]["event"] == "from stdlib" and lines[1]["logger"] == "grpc" and lines[1]["level"] == "warning"


def test_console_renderer_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=False)
    structlog.get_logger("lamina.test").info("stack_started", name="default")
    err = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().err)
    assert "stack_started" in err and "name=default" in err and not err.lstrip().startswith("{")
