"""The redactor's secret registry is re-entrant: registering the audit signing key adds
secrets to it, and rebuilding its pattern can run a finalizer (a GC'd HTTP client closing) whose
logging redacts again on the same thread. That must not deadlock (it hung the full suite)."""

from __future__ import annotations

import threading

import auth.redaction as redaction


def test_a_redact_inside_the_registry_rebuild_does_not_deadlock(monkeypatch):
    registry = redaction._Registry()
    for i in range(redaction._REGEX_THRESHOLD + 5):
        registry.add(f"secret-value-{i:04d}-abcdefgh")
    original = redaction._trie_pattern
    nested: list[object] = []

    def rebuild_with_a_finalizer(values):
        if not nested:  # a finalizer runs once
            nested.append(None)
            nested.append(registry.current())  # what its log line does mid-rebuild
        return original(values)

    monkeypatch.setattr(redaction, "_trie_pattern", rebuild_with_a_finalizer)
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(registry.current()), daemon=True)
    worker.start()
    worker.join(10)
    assert done and nested, "the registry deadlocked on a re-entrant redact"
    assert registry.current().regex.search("x secret-value-0003-abcdefgh y")


def test_a_secret_added_during_a_rebuild_is_not_lost(monkeypatch):
    registry = redaction._Registry()
    for i in range(redaction._REGEX_THRESHOLD + 5):
        registry.add(f"secret-value-{i:04d}-abcdefgh")
    original = redaction._trie_pattern

    def rebuild_while_adding(values):
        monkeypatch.setattr(redaction, "_trie_pattern", original)
        registry.add("late-secret-value-zyxwvuts")
        return original(values)

    monkeypatch.setattr(redaction, "_trie_pattern", rebuild_while_adding)
    worker = threading.Thread(target=registry.current, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive()
    assert "late-secret-value-zyxwvuts" in dict(registry.current().pairs)
