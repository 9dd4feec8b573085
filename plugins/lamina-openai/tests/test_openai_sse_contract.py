from typing import Any, ClassVar

from lamina.testing.contracts import CodecContract


class TestOpenAISse(CodecContract):
    """The contract's round trip includes usage, which OpenAI streams carry only on request."""

    registered_name = "openai-sse"
    options: ClassVar[dict[str, Any]] = {"include_usage": True}
