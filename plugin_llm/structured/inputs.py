"""The ``input`` of a structured call: a string or a list of text and image blocks, checked.

:func:`normalise_input` turns what a plugin passed into ``PluginLlmTextInput`` /
``PluginLlmImageInput`` blocks, or raises ``ValueError`` naming the item, the problem and the fix
(a misspelt key, a file path for a URL, text UTF-8 cannot encode), before any provider call.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Mapping

from plugin_llm.types import PluginLlmImageInput, PluginLlmTextInput

#: one block of a structured call's input
Block = PluginLlmTextInput | PluginLlmImageInput

_TEXT_KEYS = frozenset({"type", "text"})
_IMAGE_KEYS = frozenset({"type", "data", "url", "mime_type", "file_name"})
_URL_SCHEMES = ("http://", "https://", "data:")
# RFC 6838 type/subtype; also keeps ";" and "," out of the data: URL we build.
_MIME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*$")
_SNIPPET = 40  # characters of a bad str value shown in an error message
_MAX_BLOCKS = 100_000  # input blocks in one call: far beyond any context window


def snippet(value: Any) -> str:
    """A short description of a bad value for an error message: never an unbounded ``repr``.

    Strings are shown truncated, small numbers and None/bools as they are,
    anything else (huge ints, containers, arbitrary objects) by type name.
    """
    if isinstance(value, str):
        return repr(str(value[:_SNIPPET])) + ("..." if len(value) > _SNIPPET else "")
    if value is None or isinstance(value, bool):
        return repr(value)
    if type(value) is int and -10**15 < value < 10**15:
        return int.__repr__(value)
    if type(value) is float:
        return float.__repr__(value)
    return f"a value of type {type(value).__name__}"


def normalise_input(input: Any) -> tuple[Block, ...]:  # noqa: A002 - the public parameter name
    """Return ``input`` as a tuple of ``PluginLlmTextInput``/``PluginLlmImageInput``.

    Accepts a string (one text block), or a list or tuple whose items are those dataclasses, dicts of the
    same shape (``{"type": "text", "text": ...}``, ``{"type": "image",
    "data": b"...", "mime_type": ..., "file_name": ...}`` or ``{"type":
    "image", "url": ...}``; ``type`` may be omitted when ``text`` or
    ``data``/``url`` makes it obvious) or bare strings (text). Raises
    ``ValueError`` naming the item index, the problem and the fix, so bad
    input fails before any provider call. Already-normalised input passes
    through unchanged, so calling this twice is harmless.
    """
    if isinstance(input, str):  # one text block: the obvious meaning of a plain string
        blocks = (PluginLlmTextInput(check_text("input", input)),)
        if not input.strip():
            raise ValueError("input has no content: the text is blank. Put the material to process in input.")
        return blocks
    if isinstance(input, (bytes, Mapping, PluginLlmTextInput, PluginLlmImageInput)) or not isinstance(
        input, (list, tuple)
    ):
        raise ValueError(
            f"input must be a string or a list of text/image blocks, got {type(input).__name__}. "
            "Wrap it in a list, e.g. input=[{'type': 'text', 'text': '...'}]."
        )
    if not input:
        raise ValueError(
            "input is empty: complete_structured needs at least one text or image block, "
            "e.g. input=[{'type': 'text', 'text': '...'}]."
        )
    if len(input) > _MAX_BLOCKS:
        raise ValueError(
            f"input has {len(input):,} blocks; at most {_MAX_BLOCKS:,} are accepted in one call. "
            "Join small text blocks into one, or split the work over several calls."
        )
    blocks = tuple(_normalise_item(index, item) for index, item in enumerate(input))
    if not any(isinstance(b, PluginLlmImageInput) or b.text.strip() for b in blocks):
        raise ValueError(
            "input has no content: every text block is blank and there is no image. "
            "Put the material to process in input, e.g. input=[{'type': 'text', 'text': '...'}]."
        )
    return blocks


def _normalise_item(index: int, item: Any) -> Block:
    """Turn one ``input`` item into a block, or raise a ValueError naming ``input[index]``."""
    where = f"input[{index}]"
    if isinstance(item, PluginLlmTextInput):
        _checked_text(where, item.text)
        return item
    if isinstance(item, PluginLlmImageInput):
        return _image_block(where, item.data, item.url, item.mime_type, item.file_name)
    if isinstance(item, str):
        return PluginLlmTextInput(check_text(where, item))
    if isinstance(item, Mapping):
        return _block_from_dict(where, item)
    raise ValueError(
        f"{where}: unsupported block of type {type(item).__name__}. Use a str, "
        "PluginLlmTextInput(text), PluginLlmImageInput(data=bytes|url=str) or a dict "
        "{'type': 'text', 'text': ...} / {'type': 'image', 'data': ... or 'url': ...}."
    )


def _block_from_dict(where: str, item: Mapping[str, Any]) -> Block:
    """Build a block from a dict, inferring a missing ``type`` from its keys."""
    kind = item["type"] if "type" in item else _infer_type(where, item)
    if kind == "text":
        _reject_unknown_keys(where, item, _TEXT_KEYS)
        if "text" not in item:
            raise ValueError(f"{where}: text block has no 'text'. Use {{'type': 'text', 'text': '...'}}.")
        return PluginLlmTextInput(_checked_text(where, item["text"]))
    if kind == "image":
        _reject_unknown_keys(where, item, _IMAGE_KEYS)
        return _image_block(
            where,
            item.get("data"),
            item.get("url"),
            item.get("mime_type", "image/png"),
            item.get("file_name", ""),
        )
    raise ValueError(
        f"{where}: unknown block type {snippet(kind)}. Use 'text' ({{'type': 'text', 'text': '...'}}) or "
        "'image' ({'type': 'image', 'data': b'...', 'mime_type': 'image/png'} or "
        "{'type': 'image', 'url': 'https://...'})."
    )


def _infer_type(where: str, item: Mapping[str, Any]) -> str:
    """The block type of a dict without ``"type"``: text if it has ``text``, image if ``data``/``url``."""
    has_text = "text" in item
    has_image = "data" in item or "url" in item
    if has_text and not has_image:
        return "text"
    if has_image and not has_text:
        return "image"
    keys = ", ".join(snippet(k) for k in list(item)[:8]) + (", ..." if len(item) > 8 else "") if item else "no keys"
    raise ValueError(
        f"{where}: cannot tell the block type of a dict with {keys}. Add 'type': 'text' "
        "(with 'text') or 'type': 'image' (with 'data' or 'url')."
    )


def _reject_unknown_keys(where: str, item: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """Refuse misspelt keys (``mime`` for ``mime_type``) instead of silently ignoring them."""
    for key in item:
        if key not in allowed:
            close = difflib.get_close_matches(key[:_SNIPPET], sorted(allowed), n=1) if isinstance(key, str) else []
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"{where}: unknown key {snippet(key)} in a {snippet(item.get('type', 'block'))} block; "
                f"allowed keys are {', '.join(sorted(allowed))}.{hint}"
            )


def _checked_text(where: str, text: Any) -> str:
    """Return ``text`` if it is a str that can be sent, else raise a ValueError naming the item."""
    if not isinstance(text, str):
        raise ValueError(f"{where}: 'text' must be a str, got {type(text).__name__}.")
    return check_text(f"{where}: 'text'", text)


def text_problem(text: str) -> str | None:
    """What makes ``text`` unsendable, or None: a lone UTF-16 surrogate is a valid Python str (and JSON
    allows it as ``"\\ud800"``) but not Unicode text; UTF-8 cannot encode it and no provider takes it.
    (An ASCII str costs one ``isascii()``.)"""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"has a lone surrogate (U+{ord(text[exc.start]):04X}) at character {exc.start}: it is not valid "
                "Unicode text, so it cannot be sent as UTF-8; remove it or replace it (in Python "
                "text.encode('utf-8', 'replace').decode('utf-8')), or send the whole pair when the text was cut "
                "inside a character")
    return None


def check_text(where: str, text: str) -> str:
    """``text`` unchanged, or ``ValueError`` naming ``where`` when it cannot be sent (:func:`text_problem`)."""
    problem = text_problem(text)
    if problem is not None:
        raise ValueError(f"{where} {problem}")
    return text


def _image_block(where: str, data: Any, url: Any, mime_type: Any, file_name: Any) -> PluginLlmImageInput:
    """Validate image fields and build the block (exactly one of bytes ``data`` or ``url``)."""
    if data is None and url is None:
        raise ValueError(
            f"{where}: image block has neither 'data' nor 'url'. Pass data=<bytes> (with mime_type) "
            "or url='https://...'."
        )
    if data is not None and url is not None:
        raise ValueError(f"{where}: image block has both 'data' and 'url'. Pass exactly one of them.")
    if not isinstance(file_name, str):
        raise ValueError(f"{where}: 'file_name' must be a str, got {type(file_name).__name__}.")
    if url is not None:
        return PluginLlmImageInput(url=_checked_url(where, url), file_name=file_name)
    if isinstance(data, bytearray):
        data = bytes(data)
    if not isinstance(data, bytes):
        hint = " If it is base64 text, decode it with base64.b64decode() first." if isinstance(data, str) else ""
        raise ValueError(f"{where}: image 'data' must be bytes, got {type(data).__name__}.{hint}")
    if not data:
        raise ValueError(f"{where}: image 'data' is empty (0 bytes). Pass the image file's bytes.")
    if not isinstance(mime_type, str) or not _MIME_RE.match(mime_type):
        raise ValueError(
            f"{where}: image 'mime_type' must be a media type such as 'image/png' or 'image/jpeg', "
            f"got {snippet(mime_type)}."
        )
    return PluginLlmImageInput(data=data, mime_type=mime_type, file_name=file_name)


def _checked_url(where: str, url: Any) -> str:
    """Accept only http(s) and data: URLs; anything else (paths, file:) is refused."""
    if not isinstance(url, str):
        raise ValueError(f"{where}: image 'url' must be a str, got {type(url).__name__}.")
    if not url.strip().lower().startswith(_URL_SCHEMES):
        raise ValueError(
            f"{where}: image 'url' must start with http://, https:// or data:, got {snippet(url)}. "
            "For a local file, read it and pass data=<bytes> with mime_type."
        )
    return url
