"""``agent``: the Hermes agent modules plugins import (base classes and helpers)."""
