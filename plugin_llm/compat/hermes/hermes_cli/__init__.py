"""``hermes_cli`` for plugins: ``config`` and ``auth`` (status only)."""

#: The Hermes release whose plugin SDK this compat layer follows.
__version__ = "0.19.0"
