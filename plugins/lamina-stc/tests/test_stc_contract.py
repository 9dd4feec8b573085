"""Both STC codecs pass the conformance kit's codec contract."""

from lamina.testing.contracts import CodecContract


class TestStc(CodecContract):
    registered_name = "stc"


class TestStcZstd(CodecContract):
    registered_name = "stc-zstd"
