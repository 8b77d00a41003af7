"""One ``ctx.llm`` call on its way through the gateway: the checks of what a plugin passes
(``validate``), the request built once per public call (``request``), the steps a pipeline yields
and the state it keeps (``steps``), the collaborators it is given (``protocols``), the audit of its
outcome (``audit``), the flows themselves (``pipeline``) and the shells that perform their steps
(``shells``). ``plugin_llm.llm`` is the facade over them."""
