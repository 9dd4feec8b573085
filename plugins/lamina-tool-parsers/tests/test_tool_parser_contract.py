from lamina.testing.contracts import ToolParserContract


class TestHermes(ToolParserContract):
    registered_name = "hermes"


class TestLlama3Json(ToolParserContract):
    registered_name = "llama3-json"


class TestJson(ToolParserContract):
    registered_name = "json"
