"""The embedded ``local`` model and its HTTP server: an offline, deterministic stand-in.

:mod:`.model` answers one chat request (``generate``) from its parts: the messages and tokens
(:mod:`.messages`), the ``key: value`` facts of the user messages (:mod:`.facts`), values valid
for a JSON Schema (:mod:`.instances`, with the scalar formats of :mod:`.values`) and the tool
calls a message asks for (:mod:`.tools`). :mod:`.server` serves it over OpenAI's HTTP API
(``plugin-llm serve-local``). Importing this package imports none of them.
"""
