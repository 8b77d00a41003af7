"""A tiny message bridge: messages dropped into ``$HERMES_HOME/inbox.jsonl``
reach the running conversation.

- ``ctx.register_platform("inbox", ...)`` registers the adapter (a real bridge
  would wrap a chat service or a webhook receiver the same way);
- ``ctx.register_cli_command("inbox", ...)`` adds ``plugin-llm inbox send
  TEXT [--role ROLE]`` and ``plugin-llm inbox show`` for another terminal or a
  script;
- ``/inbox`` (in ``plugin-llm chat``) reads the new messages and hands each to
  ``ctx.inject_message(content, role)``. While the assistant is idle a message
  becomes the next input (the chat loop runs it as a turn); during a turn it
  interrupts it. Non-user roles arrive prefixed, e.g. ``[system] ...``.
  ``inject_message`` returns False when no session is attached (for example
  under ``plugin-llm run``), and the message stays unread.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _inbox_path() -> Path:
    return Path(os.environ.get("HERMES_HOME") or "~/.hermes").expanduser() / "inbox.jsonl"


class InboxAdapter:
    """Reads new lines of the inbox file; appends with one O_APPEND write per message."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or _inbox_path()
        self.offset = 0

    def send(self, text: str, role: str = "user") -> None:
        line = (json.dumps({"role": role, "text": text}, ensure_ascii=False) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def poll(self) -> tuple[list[dict], int]:
        """(messages appended since the last commit, bytes they span); a torn last line waits."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return [], 0
        complete = data[: data.rfind(b"\n") + 1]
        messages = []
        for line in complete.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict) and isinstance(item.get("text"), str) and item["text"].strip():
                messages.append({"role": str(item.get("role") or "user"), "text": item["text"]})
        return messages, len(complete)

    def commit(self, consumed: int) -> None:
        self.offset += consumed


def register(ctx):
    adapter = InboxAdapter()

    ctx.register_platform(
        "inbox",
        "File inbox ($HERMES_HOME/inbox.jsonl)",
        adapter_factory=lambda **_: InboxAdapter(),
        check_fn=lambda: True,
        description="messages appended to a JSONL file by other programs",
    )

    def inbox(raw_args: str) -> str:
        messages, consumed = adapter.poll()
        if not messages:
            return "Inbox empty."
        queued = 0
        for message in messages:
            if not ctx.inject_message(message["text"], role=message["role"]):
                return "No active session: messages left in the inbox."
            queued += 1
        adapter.commit(consumed)
        return f"Queued {queued} inbox message(s)."

    ctx.register_command("inbox", inbox, description="bring new inbox messages into the conversation")

    def setup(parser) -> None:
        sub = parser.add_subparsers(dest="inbox_action", required=True)
        send = sub.add_parser("send", help="append a message to the inbox")
        send.add_argument("text")
        send.add_argument("--role", default="user")
        sub.add_parser("show", help="print the inbox")

    def run(args) -> int:
        box = InboxAdapter()
        if args.inbox_action == "send":
            box.send(args.text, args.role)
            print(f"queued in {box.path}")
        else:
            messages, _ = box.poll()
            for m in messages:
                print(f"[{m['role']}] {m['text']}")
        return 0

    ctx.register_cli_command("inbox", "send messages to the running chat through the inbox file", setup, run)
