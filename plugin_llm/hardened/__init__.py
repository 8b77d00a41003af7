"""The hardened I/O helpers: reading the home's files, JSON and YAML from hostile sources, atomic writes,
terminal-safe text and bounded reprs. They import only the standard library (PyYAML for ``safe_yaml``)
and the gateway's errors, so every layer above, ``auth`` included, may use them."""
