"""The one module that writes ``config.yaml``.

Reading stays on PyYAML in :mod:`plugin_llm.config`; writing goes through :func:`edit_config`,
which loads the file with ruamel.yaml (round trip: comments, key order, quoting and indentation
survive), refuses a file that does not parse (``file:line:col: problem``), calls ``mutate(doc)``,
checks the new text parses with PyYAML and that nothing it was not asked to change changed
meaning, then writes it atomically (``config.yaml.bak`` holding the previous version) under an
advisory lock, so two CLI processes never lose each other's edit. The helpers
(:func:`ensure_map`, :func:`set_value`, :func:`list_add`, ...) quote new strings PyYAML would read
as something else (``on``, ``no``, ``*``) and keep section comments with their section.

Nothing is written (and no ``.bak`` made) when the edit changes nothing. Parts: :mod:`.writing`
(the file), :mod:`.roundtrip` (the document and its checks), :mod:`.edits`, :mod:`.comments`.
"""

from plugin_llm.config_edit.edits import delete_value, ensure_map, get_value, list_add, list_remove, set_value
from plugin_llm.config_edit.roundtrip import ConfigEditError
from plugin_llm.config_edit.writing import EditResult, edit_config

__all__ = [
    "ConfigEditError",
    "EditResult",
    "edit_config",
    "ensure_map",
    "list_add",
    "list_remove",
    "set_value",
    "delete_value",
    "get_value",
]
