"""Process isolation: a plugin with ``isolation: process`` runs in a child process of its own.

:mod:`.remote` is the host side (it starts, watches and restarts the child; its parts are the
``host_*`` modules), :mod:`.worker` the child (``python -m plugin_llm.plugins.isolation.worker``),
:mod:`.protocol` what the two say over the child's stdin/stdout, and :mod:`.sandbox` how the child
is started and confined (bubblewrap, resource limits, an allowlisted environment). Importing this
package imports none of them.
"""
