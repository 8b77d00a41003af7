"""The actions of ``plugin-llm audit``, by concern; the command itself is :mod:`plugin_llm.cli.audit_cmd`."""
