"""A small file-backed memory provider: ``$HERMES_HOME/memory/memories.jsonl``.

Select it with ``memory.provider: jsonl`` in config.yaml. The host calls
``recall(query)`` before each turn (the answer rides on that turn's user
message, never stored) and ``remember(user, assistant)`` after it.

What it remembers: lines of the user's message that start with
``remember:`` / ``remember that ...``, and whatever ``/remember <text>`` is
given. Recall returns the stored memories sharing the most words with the
query.

The store is safe to share between processes without locks:

- **append-only** — a memory is one JSON line written with a single
  ``os.write`` on a descriptor opened with ``O_APPEND``, so concurrent writers
  never interleave inside a line and the file is never rewritten;
- **de-duplicated at read time** — each line carries ``id``, the SHA-256 of
  the normalised memory text. Two processes writing the same memory at the
  same moment both append it; readers keep the first line per ``id``;
- **crash-tolerant** — a torn last line (a crash mid-write) is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

from plugin_llm.plugins import MemoryProvider

_REMEMBER = re.compile(r"^\s*remember(?:\s+that)?\s*[:,]?\s+(?P<fact>.+?)\s*$", re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9][a-z0-9_-]{2,}")
_STOP = frozenset("the and for are but not you your with that this from have what when where which who".split())


def memory_id(text: str) -> str:
    """Content hash of a memory: the same words give the same id in every process."""
    normalised = " ".join(text.lower().split())
    return hashlib.sha256(normalised.encode("utf-8")).hexdigest()[:32]


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


class JsonlMemory(MemoryProvider):
    name = "jsonl"

    def __init__(self, path: Path, *, max_results: int = 3) -> None:
        self.path = Path(path)
        self.max_results = max_results

    def is_available(self) -> bool:
        return True

    def entries(self) -> list[dict]:
        """Every stored memory once, oldest first (duplicates and torn lines skipped)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        seen: set[str] = set()
        out: list[dict] = []
        for line in raw.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue  # torn or foreign line
            if not isinstance(item, dict) or not isinstance(item.get("text"), str):
                continue
            key = item.get("id") or memory_id(item["text"])
            if key in seen:
                continue
            seen.add(key)
            out.append(item)
        return out

    def add(self, text: str, *, session_id: str = "", source: str = "") -> bool:
        """Append one memory; False when it is blank or already stored."""
        text = " ".join(text.split())
        if not text:
            return False
        key = memory_id(text)
        if any(e.get("id") == key for e in self.entries()):
            return False
        record = {"id": key, "text": text, "ts": round(time.time(), 3), "session_id": session_id,
                  "source": source, "pid": os.getpid()}
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)  # one write per line: appends never interleave
        finally:
            os.close(fd)
        return True

    def recall(self, query: str, *, session_id: str) -> str | None:
        wanted = _words(query)
        if not wanted:
            return None
        scored = []
        for index, entry in enumerate(self.entries()):
            score = len(wanted & _words(entry["text"]))
            if score:
                scored.append((-score, -index, entry["text"]))
        if not scored:
            return None
        scored.sort()
        return "\n".join(f"- {text}" for _, _, text in scored[: self.max_results])

    def remember(self, user_message: str, assistant_message: str, *, session_id: str) -> None:
        for line in (user_message or "").splitlines():
            match = _REMEMBER.match(line)
            if match:
                self.add(match.group("fact"), session_id=session_id, source="turn")


def register(ctx):
    home = os.environ.get("HERMES_HOME") or "~/.hermes"  # ctx exposes no host paths
    store = JsonlMemory(Path(home).expanduser() / "memory" / "memories.jsonl")
    ctx.register_memory_provider(store)

    def remember_cmd(raw_args: str) -> str:
        if not raw_args.strip():
            return "Usage: /remember <something worth remembering>"
        added = store.add(raw_args, source="command")
        return "Remembered." if added else "Already remembered."

    def memories_cmd(raw_args: str) -> str:
        entries = store.entries()
        if not entries:
            return f"No memories yet ({store.path})."
        return "\n".join(f"- {e['text']}" for e in entries)

    ctx.register_command("remember", remember_cmd, description="store a memory", args_hint="<text>")
    ctx.register_command("memories", memories_cmd, description="list stored memories")
