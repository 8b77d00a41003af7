"""``hermes_cli`` for plugins: ``config`` and ``auth`` (status only)."""

#: The Hermes release whose plugin API this host implements (what ``requires_hermes`` is checked against).
__version__ = "0.21.3"
