"""``python -m plugin_llm``: the same as the ``plugin-llm`` command."""

import sys

from plugin_llm.cli.main import main

sys.exit(main())
