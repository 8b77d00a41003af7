"""One ``ctx.llm`` call on its way through the gateway: the checks of what a plugin passes
(``validate``), the request built once per public call (``request``), the steps a pipeline yields
and the state it keeps (``steps``), the collaborators it is given (``protocols``), the flows
(``pipeline``), the shells that perform their steps (``shells``), the call's records (``audit``)
and its checked reply and result (``response``). ``plugin_llm.llm`` is the facade over them."""
