"""Exact input token counts for the models whose tokenizer ships with litellm, offline.

OpenAI's models count with o200k_base or cl100k_base, built from the BPE files litellm bundles
(found with importlib, litellm is never imported; each checked against its published SHA-256)
into a ``tiktoken.Encoding``: once per process, in a background thread started by the first
limited call that needs it; tiktoken is imported there and never downloads anything. A request
counts its text exactly plus the chat format's overhead, and its tools, tool calls and
response_format as JSON plus a margin: a ceiling of the prompt tokens the provider bills. What
cannot be counted so - other models, content that is not text, text beyond
:data:`MAX_EXACT_BYTES`, an encoding not loaded (yet) - counts by the byte bound
(:func:`~plugin_llm.limits.pricing.input_token_bound`). See docs/limits.md, "How the input is counted".
"""

from __future__ import annotations

import asyncio
import binascii
import functools
import hashlib
import importlib.util
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from plugin_llm.limits.pricing import input_token_bound, json_token_bound, message_token_bound
from plugin_llm.limits.settings import MAX_CALL_TOKENS

__all__ = ["encoding_for", "count_input", "encoding", "wait", "await_loaded", "pending", "load_seconds",
           "MAX_EXACT_BYTES", "LOAD_WAIT"]

log = logging.getLogger("plugin_llm.limits")

O200K, CL100K = "o200k_base", "cl100k_base"
#: the most UTF-8 bytes of one request counted exactly, the rest by the byte bound: English text counts at
#: 30-90 ns a byte, the slowest text (long runs without a word boundary) at about 1 us (bench_reservation.py)
MAX_EXACT_BYTES = 32 * 1024
#: the most a call waits for an encoding still loading (only when the byte bound was refused)
LOAD_WAIT = 10.0
#: the chat format's framing, generously (OpenAI's cookbook: 3 per message, 1 per name, 3 to prime the reply)
PER_MESSAGE, PER_NAME, PER_PART, PER_REQUEST = 4, 1, 3, 8
#: JSON (tools, tool calls, response_format) as the provider renders it: its tokens + 1/4 + these
JSON_OVERHEAD, JSON_PER_ITEM = 32, 16
_MAX_FILE_BYTES = 16 << 20
_MAX_MODEL_NAME = 200
_TEXT_PART_KEYS = frozenset({"type", "text", "cache_control"})
#: the roles that are one token in both encodings (a test checks it): a plain message's role is not encoded
_ONE_TOKEN_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
#: models whose input the provider adds to (web search) or that take audio or images by name: the byte bound
_NOT_PLAIN_CHAT = ("search", "research", "audio", "realtime", "transcribe", "tts", "image", "computer-use")


@dataclass(frozen=True)
class _Bundled:
    file: str  # tiktoken's cache name for it (the SHA-1 of its URL), which litellm ships
    sha256: str  # the hash tiktoken checks a download against
    pat_str: str
    special_tokens: dict[str, int]


_BUNDLED = {
    CL100K: _Bundled(
        "9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
        {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260,
         "<|endofprompt|>": 100276},
    ),
    O200K: _Bundled(
        "fb374d419588a4632f3f557e76b4b70aebbca790",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "|".join([
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""",
            r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
            r"""\s*[\r\n]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",
        ]),
        {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    ),
}

# tiktoken's model table (tiktoken/model.py), for these two encodings
_MODELS = {
    "o1": O200K, "o3": O200K, "o4-mini": O200K, "gpt-5": O200K, "gpt-4.1": O200K, "gpt-4o": O200K,
    "gpt-4": CL100K, "gpt-3.5-turbo": CL100K, "gpt-3.5": CL100K, "gpt-35-turbo": CL100K,
    "text-embedding-ada-002": CL100K, "text-embedding-3-small": CL100K, "text-embedding-3-large": CL100K,
}
_PREFIXES = (
    ("o1-", O200K), ("o3-", O200K), ("o4-mini-", O200K), ("gpt-5", O200K), ("gpt-4.5-", O200K),
    ("gpt-4.1-", O200K), ("chatgpt-4o-", O200K), ("gpt-4o-", O200K), ("gpt-4-", CL100K),
    ("gpt-3.5-turbo-", CL100K), ("gpt-35-turbo-", CL100K),
)


@functools.lru_cache(maxsize=512)
def encoding_for(provider: str, model: str) -> str | None:
    """The encoding that counts ``provider/model``'s input exactly, or None (the byte bound).

    Only OpenAI's own endpoint: a deployment name (azure), a router or an operator's endpoint
    (custom) may serve another model under the same name."""
    if not isinstance(provider, str) or not isinstance(model, str) or provider.strip().lower() != "openai":
        return None
    name = model.strip().lower()
    if len(name) > _MAX_MODEL_NAME:
        return None
    if name.startswith("openai/"):
        name = name[len("openai/"):]
    if name.startswith("ft:"):  # ft:<base model>:<org>::<id>
        name = name[3:].split(":", 1)[0]
    if any(word in name for word in _NOT_PLAIN_CHAT):
        return None
    found = _MODELS.get(name)
    if found is not None:
        return found
    for prefix, encoding_name in _PREFIXES:
        if name.startswith(prefix):
            return encoding_name
    return None


# -- loading, once per process --------------------------------------------------------------------------------
class _Slot:
    """One encoding's load: ``ready`` is set when it ended, with ``encoding`` or ``error``."""

    __slots__ = ("ready", "encoding", "error", "seconds")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.encoding: Any = None
        self.error: str | None = None
        self.seconds: float | None = None


_slots: dict[str, _Slot] = {}
_lock = threading.Lock()


def _slot(name: str) -> _Slot:
    slot = _slots.get(name)
    if slot is not None:
        return slot
    with _lock:
        slot = _slots.get(name)
        if slot is None:
            slot = _slots[name] = _Slot()
            try:
                threading.Thread(target=_load_into, args=(name, slot), name=f"plugin-llm-tokenizer-{name}",
                                 daemon=True).start()
            except RuntimeError as exc:  # (interpreter shutting down): the byte bound, as for a missing file
                _failed(name, slot, f"no thread to load it in ({exc})")
    return slot


def _load_into(name: str, slot: _Slot) -> None:
    started = time.perf_counter()
    try:
        slot.encoding = _load(name)
    except Exception as exc:  # noqa: BLE001 - any failure means the byte bound, said once in the log
        _failed(name, slot, f"{type(exc).__name__}: {exc}")
    finally:
        slot.seconds = time.perf_counter() - started
        slot.ready.set()


def _failed(name: str, slot: _Slot, reason: str) -> None:
    slot.error = reason[:500]
    log.warning("limits: cannot load the %s tokenizer bundled with litellm (%s); the input tokens of limited calls "
                "to the models it serves count by the byte bound (about 4x the real count) in this process; "
                "reinstalling litellm restores its files", name, slot.error)
    slot.ready.set()  # (after the warning: who waited for the load finds it said)


def _tokenizers_dir() -> Path:
    spec = importlib.util.find_spec("litellm")  # locates the package without importing it
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    if not locations:
        raise FileNotFoundError("litellm is not installed")
    return Path(locations[0]) / "litellm_core_utils" / "tokenizers"


def _read_bpe(name: str) -> dict[bytes, int]:
    """The encoding's mergeable ranks from litellm's copy of its file, checked against its published hash."""
    bundled = _BUNDLED[name]
    path = _tokenizers_dir() / bundled.file
    with open(path, "rb") as f:
        data = f.read(_MAX_FILE_BYTES + 1)
    if len(data) > _MAX_FILE_BYTES:
        raise ValueError(f"{path} is larger than {_MAX_FILE_BYTES} bytes, not the {name} file")
    if hashlib.sha256(data).hexdigest() != bundled.sha256:
        raise ValueError(f"{path} is not the published {name} file (its SHA-256 differs)")
    a2b = binascii.a2b_base64
    return {a2b(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}


def _load(name: str) -> Any:
    ranks = _read_bpe(name)
    import tiktoken  # here only: a limited call to a model it counts needs it

    bundled = _BUNDLED[name]
    return tiktoken.Encoding(name, pat_str=bundled.pat_str, mergeable_ranks=ranks,
                             special_tokens=dict(bundled.special_tokens))


def encoding(name: str) -> Any:
    """The loaded encoding, or None while it loads (the first ask starts the load) or if it failed."""
    slot = _slots.get(name)
    if slot is None:
        slot = _slot(name)
    return slot.encoding


def pending(name: str) -> bool:
    """Whether the encoding is still loading (waiting for it may give an exact count)."""
    slot = _slots.get(name)
    return slot is not None and not slot.ready.is_set()


def wait(name: str, timeout: float) -> Any:
    """The encoding, waiting at most ``timeout`` seconds for its load (on this thread); None if not loaded."""
    slot = _slot(name)
    if not slot.ready.is_set() and timeout > 0:
        slot.ready.wait(timeout)
    return slot.encoding


async def await_loaded(name: str, timeout: float) -> Any:
    """:func:`wait` for async code: the wait is in a worker thread, never on the event loop."""
    slot = _slot(name)
    if not slot.ready.is_set() and timeout > 0:
        loop = asyncio.get_running_loop()
        await asyncio.wait((loop.run_in_executor(None, slot.ready.wait, timeout),), timeout=timeout)
    return slot.encoding


def load_seconds(name: str) -> float | None:
    """How long the encoding's load took in this process (None: not loaded, or loading)."""
    slot = _slots.get(name)
    return slot.seconds if slot is not None and slot.ready.is_set() else None


def _forget() -> None:
    """A forked child has no loader thread: it loads again, on its own, when it needs to."""
    global _lock
    _slots.clear()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


# -- counting ------------------------------------------------------------------------------------------------
def count_input(name: str | None, messages: Iterable[Mapping[str, Any]], extra: Iterable[Any] = ()) -> tuple[int, bool]:
    """A ceiling of the input tokens of a request, and whether it was counted exactly (True) or,
    in part or whole, by the byte bound (False). Never waits: an encoding not loaded yet starts
    loading, and this request counts by the bound."""
    found = encoding(name) if name is not None else None
    if found is None:
        return min(MAX_CALL_TOKENS, input_token_bound(messages, extra)), False
    encode = found.encode_ordinary
    left = MAX_EXACT_BYTES

    def tokens(text: str) -> int | None:
        nonlocal left
        if text.isascii():
            size = len(text)
        else:
            try:
                size = len(text.encode("utf-8"))
            except UnicodeEncodeError:  # a lone surrogate: how the provider sees it is unknown
                return None
        if size > left:
            return None
        left -= size
        return len(encode(text))

    exact = True
    total = PER_REQUEST
    for message in messages:
        if type(message) is dict and len(message) == 2:  # the usual message: a role and a text
            content = message.get("content")
            if type(content) is str and message.get("role") in _ONE_TOKEN_ROLES:
                counted = tokens(content)
                if counted is not None:
                    total += PER_MESSAGE + 1 + counted
                    continue
        counted = _message_tokens(message, tokens)
        if counted is None:
            counted, exact = message_token_bound(message), False
        total += counted
    for value in extra:
        if value is None:
            continue
        counted = _json_tokens(value, tokens)
        if counted is None:
            counted, exact = json_token_bound(value), False
        total += counted
    return min(MAX_CALL_TOKENS, total), exact


def _json_tokens(value: Any, tokens: Callable[[str], int | None]) -> int | None:
    counted = tokens(json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":")))
    if counted is None:
        return None
    items = len(value) if isinstance(value, (list, tuple)) else 1
    return counted + counted // 4 + JSON_OVERHEAD + JSON_PER_ITEM * items


def _message_tokens(message: Any, tokens: Callable[[str], int | None]) -> int | None:
    """One message's tokens, or None when a part of it cannot be counted exactly."""
    if not isinstance(message, Mapping):
        return None
    total = PER_MESSAGE
    for key, value in message.items():
        if value is None:
            continue
        if isinstance(value, str) and key in ("role", "content", "name", "tool_call_id"):
            counted = 1 if key == "role" and value in _ONE_TOKEN_ROLES else tokens(value)
            if counted is None:
                return None
            total += counted + (PER_NAME if key == "name" else 0)
        elif key == "content" and isinstance(value, (list, tuple)):
            for part in value:
                if (not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str)
                        or not part.keys() <= _TEXT_PART_KEYS):
                    return None  # an image, audio, a file...: the byte bound's worst case
                counted = tokens(part["text"])
                if counted is None:
                    return None
                total += counted + PER_PART
        elif key in ("tool_calls", "function_call"):
            counted = _json_tokens(value, tokens)
            if counted is None:
                return None
            total += counted
        else:
            return None  # a key the chat format may bill otherwise
    return total
