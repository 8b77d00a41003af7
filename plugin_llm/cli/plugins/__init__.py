"""The actions of ``plugin-llm plugins``, one module each; the command itself is :mod:`plugin_llm.cli.plugins_cmd`."""
