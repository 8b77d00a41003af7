"""Minimal plugin — registers a tool and a hook.

Written in the short forms the Hermes docs use, which this host accepts
unchanged: ``register_tool(name, schema, handler)`` (no toolset), a handler
taking only ``params``, and a ``post_tool_call`` hook declaring ``params``
instead of ``args`` (callbacks receive only the keyword arguments their
signature accepts).

Try it: ``plugin-llm chat`` then ``use the hello_world tool with name=Ada``.
"""


def register(ctx):
    # --- tool: hello_world ---
    schema = {
        "name": "hello_world",
        "description": "Returns a friendly greeting for the given name.",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {
                    "type": "string",
                    "description": "Name to greet",
                }
            },
            "required": ["name"],
        },
    }

    def handle_hello(params):
        name = params.get("name", "World")
        return f"Hello, {name}! (from the hello-world plugin)"

    ctx.register_tool("hello_world", schema, handle_hello)

    # --- hook: log every tool call ---
    def on_tool_call(tool_name, params, result):
        print(f"[hello-world] tool called: {tool_name}")

    ctx.register_hook("post_tool_call", on_tool_call)
