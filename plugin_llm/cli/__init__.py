"""The ``plugin-llm`` command line. One module per subcommand."""
