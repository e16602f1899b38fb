"""The few fields the gateway reads from a form body (the audio endpoints' multipart upload):
found with python-multipart's streaming parsers, without building file objects or copying the
upload; every other part is skipped. The body itself is forwarded unchanged.
"""

from __future__ import annotations

from urllib.parse import unquote_plus

from python_multipart import MultipartParser, QuerystringParser
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import parse_options_header

# A wanted field longer than this is not a model name or a flag: ignored.
_MAX_VALUE = 4096


def form_fields(content_type: bytes, body: bytes, wanted: frozenset[str]) -> dict[str, str]:
    """The `wanted` text fields of a multipart/form-data or urlencoded `body` (the first value
    of each); {} when the body is neither, or malformed (the engine then answers for it)."""
    kind, params = parse_options_header(content_type)
    found: dict[str, str] = {}
    name = bytearray()
    value = bytearray()
    state = {"take": False, "header": b""}

    def field_end() -> None:
        key = name.decode("latin-1")
        if key in wanted and key not in found and len(value) <= _MAX_VALUE:
            found[key] = value.decode("utf-8", "replace")
        name.clear()
        value.clear()

    try:
        if kind == b"multipart/form-data" and params.get(b"boundary"):
            header_name = bytearray()
            header_value = bytearray()

            def header_end() -> None:
                if bytes(header_name).lower() == b"content-disposition":
                    _, disposition = parse_options_header(bytes(header_value))
                    field = disposition.get(b"name", b"")
                    # A file part is never a wanted text field, however it is named.
                    state["take"] = (b"filename" not in disposition
                                     and field.decode("latin-1") in wanted)
                    name[:] = field
                header_name.clear()
                header_value.clear()

            def part_data(data: bytes, start: int, end: int) -> None:
                if state["take"] and len(value) <= _MAX_VALUE:
                    value.extend(data[start:end])

            def part_end() -> None:
                if state["take"]:
                    field_end()
                state["take"] = False
                name.clear()
                value.clear()

            mp = MultipartParser(params[b"boundary"], {
                "on_header_field": lambda d, s, e: header_name.extend(d[s:e]),
                "on_header_value": lambda d, s, e: header_value.extend(d[s:e]),
                "on_header_end": header_end,
                "on_part_data": part_data,
                "on_part_end": part_end,
            })
            mp.write(body)
            mp.finalize()
        elif kind == b"application/x-www-form-urlencoded":
            def urlencoded_end() -> None:
                key = unquote_plus(name.decode("latin-1"))
                if key in wanted and key not in found and len(value) <= _MAX_VALUE:
                    found[key] = unquote_plus(value.decode("latin-1"))
                name.clear()
                value.clear()

            qs = QuerystringParser({
                "on_field_name": lambda d, s, e: name.extend(d[s:e]),
                "on_field_data": lambda d, s, e: value.extend(d[s:e]),
                "on_field_end": urlencoded_end,
            })
            qs.write(body)
            qs.finalize()
    except (FormParserError, ValueError):
        return {}
    return found
