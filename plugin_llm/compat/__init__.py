"""Compatibility layers for plugins written for other hosts (see :mod:`.hermes`)."""
