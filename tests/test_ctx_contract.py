"""One ``ctx`` contract (plugin_llm/plugins/ctx_api.py), two carriers: the in-process ``PluginContext``
and an isolated plugin's ``ctx``. A member on one and not the other, or a signature that drifted,
fails here; the behaviour of both is compared in tests/test_isolation_process.py (the same calls in
every form, in process and out of process)."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest

from plugin_llm.plugins import ctx_api
from plugin_llm.plugins.context import PluginContext
from plugin_llm.plugins.isolation.protocol import decode_value
from plugin_llm.plugins.isolation.worker import RemoteContext

CARRIERS = (PluginContext, RemoteContext)
SCHEMA = {"name": "t", "description": "d"}


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def _shape(fn: Any) -> list[tuple[str, Any, Any]]:
    signature = fn if isinstance(fn, inspect.Signature) else inspect.signature(fn)
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def test_the_in_process_and_isolated_ctx_have_the_same_public_members():
    assert _public(PluginContext) == _public(RemoteContext)


@pytest.mark.parametrize("cls", CARRIERS, ids=lambda c: c.__name__)
def test_every_ctx_has_the_contracts_members_and_signatures(cls):
    assert _public(cls) == set(ctx_api.METHODS) | set(ctx_api.PROPERTIES)
    for name in ctx_api.PROPERTIES:
        assert isinstance(inspect.getattr_static(cls, name), property), (cls.__name__, name)
    for method in ctx_api.METHODS:
        assert _shape(getattr(cls, method)) == _shape(ctx_api.signature_of(method)), (cls.__name__, method)


def test_the_in_process_implementations_have_the_contracts_signatures():
    """What ``@implements`` wraps: the function that runs, with the contract's parameters."""
    for method in ctx_api.METHODS:
        assert _shape(inspect.unwrap(getattr(PluginContext, method))) == _shape(ctx_api.signature_of(method)), method


def test_a_ctx_method_that_drifts_from_the_contract_is_refused_when_it_is_defined():
    with pytest.raises(TypeError, match="differs from the ctx contract's register_command"):
        class Drifted:
            @ctx_api.implements
            def register_command(self, name, handler, description=""):  # args_hint forgotten
                return None
    with pytest.raises(AttributeError, match="no method 'register_anything' in its contract"):
        class Undeclared:
            @ctx_api.implements
            def register_anything(self, name):
                return None


def test_every_member_of_the_contract_has_a_way_to_the_host():
    """Local in the plugin's process, refused with a reason, or forwarded by name (the generic path)."""
    assert ctx_api.LOCAL <= set(ctx_api.PROPERTIES) | set(ctx_api.METHODS)
    assert set(ctx_api.NOT_ACROSS) <= set(ctx_api.METHODS) and all(ctx_api.NOT_ACROSS.values())
    assert set(ctx_api.PROVIDER_PARAMS) <= set(ctx_api.METHODS)
    for method, param in ctx_api.PROVIDER_PARAMS.items():
        assert param in ctx_api.signature_of(method).parameters
    for method, param in ctx_api.UNTIMED | {(m, p) for m, values in ctx_api.SET_ON_HOST.items() for p in values}:
        assert param in ctx_api.signature_of(method).parameters, (method, param)
    for name in ctx_api.LOCAL:
        assert name in vars(RemoteContext), f"{name} must be answered in the plugin's process"


# --- one binding ----------------------------------------------------------------------------


def handler(args):
    return "x"


@pytest.mark.parametrize("args, kwargs", [
    (("t", "p", SCHEMA, handler), {}),
    (("t", SCHEMA, handler), {"toolset": "p"}),
    (("t",), {"toolset": "p", "schema": SCHEMA, "handler": handler}),
    ((), {"name": "t", "toolset": "p", "schema": SCHEMA, "handler": handler}),
    (("t", SCHEMA), {"handler": handler, "toolset": "p"}),
])
def test_register_tools_call_forms_bind_to_the_same_arguments(args, kwargs):
    assert ctx_api.bind("register_tool", args, kwargs) == {
        "name": "t", "toolset": "p", "schema": SCHEMA, "handler": handler, "check_fn": None, "requires_env": None,
        "is_async": False, "description": "", "emoji": "", "override": False}


@pytest.mark.parametrize("method, args, kwargs, message", [
    ("register_tool", ("t", SCHEMA, handler), {"colour": "red"}, "unexpected keyword argument 'colour'"),
    ("register_tool", ("t", SCHEMA, handler), {"schema": SCHEMA}, "multiple values for argument 'schema'"),
    ("register_tool", ("t", SCHEMA, handler, None, None, False, "", "", False, "extra"), {}, "too many positional"),
    ("register_command", ("c",), {}, "missing a required argument: 'handler'"),
    ("register_hook", (), {}, "missing a required argument: 'name'"),
    ("inject_message", ("hi", "user", "extra"), {}, "too many positional"),
])
def test_misuse_is_one_type_error_for_every_carrier(method, args, kwargs, message):
    with pytest.raises(TypeError, match=f"^ctx.{method}\\(\\) .*{message}"):
        ctx_api.bind(method, args, kwargs)


def test_keywords_of_a_var_keyword_method_travel_as_one_mapping_and_spread_back():
    named = ctx_api.bind("dispatch_tool", ("t", {"a": 1}), {"task_id": "x"})
    assert named == {"tool_name": "t", "args": {"a": 1}, "kw": {"task_id": "x"}}
    assert ctx_api.spread("dispatch_tool", named) == {"tool_name": "t", "args": {"a": 1}, "task_id": "x"}
    with pytest.raises(TypeError, match="bad keyword argument 'args'"):  # sent by a child: it cannot alias a parameter
        ctx_api.spread("dispatch_tool", {"tool_name": "t", "args": {}, "kw": {"args": 1}})


# --- the generic path: a method nobody wrote again for the isolated ctx ------------------------


class _Worker:
    """The child's worker, with the host replaced by a recorder."""

    def __init__(self, reply: Any) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.handles: dict[int, Any] = {}
        self.reply = reply

    def handle(self, fn: Any) -> int:
        self.handles[len(self.handles) + 1] = fn
        return len(self.handles)

    def host(self, method: str, params: Any) -> Any:
        self.sent.append((method, json.loads(json.dumps(params))))  # what the channel carries
        return self.reply


class _Manifest:
    key = "p"


def test_a_method_the_isolated_ctx_does_not_special_case_is_forwarded_by_name():
    special = {name for name in ctx_api.METHODS if getattr(RemoteContext, name).__qualname__ != name}
    # a parser cannot cross; a config value is checked before the channel could convert it; the rest is generic
    assert special == {"register_cli_command", "set_config"} | (ctx_api.LOCAL & set(ctx_api.METHODS))
    worker = _Worker({"entry": True})
    ctx = RemoteContext(worker, _Manifest(), None)  # type: ignore[arg-type]

    def shout(raw: str) -> str:
        return raw.upper()

    registered = ctx.register_command("shout", shout, args_hint="<text>")
    assert bool(registered) and "command 'shout' of plugin p (out of process)" in repr(registered)
    [(method, params)] = worker.sent
    assert method == "ctx" and params["m"] == "register_command"
    assert decode_value(params["a"], lambda h: worker.handles[h]) == {
        "name": "shout", "handler": shout, "description": "", "args_hint": "<text>", "argument_mode": None}
    assert params["sig"] == {"1": [["raw", 1, False]]}


def test_a_call_outside_registration_sends_data_only_and_returns_the_hosts_answer():
    worker = _Worker({"v": '{"ok": 1}'})
    ctx = RemoteContext(worker, _Manifest(), None)  # type: ignore[arg-type]
    assert ctx.dispatch_tool("t", {"fn": handler}, task_id="x") == '{"ok": 1}'
    [(_, params)] = worker.sent
    assert params["m"] == "dispatch_tool" and not worker.handles  # no handle: the host never calls back
    assert params["a"]["kw"] == {"task_id": "x"} and params["a"]["args"]["fn"].startswith("<function")


def test_what_cannot_cross_is_bound_then_refused_by_the_host_with_its_reason():
    worker = _Worker({"v": None})
    ctx = RemoteContext(worker, _Manifest(), None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="missing a required argument: 'check_fn'"):
        ctx.register_platform("matrix", "Matrix", handler)
    assert ctx.register_platform("matrix", "Matrix", handler, handler, homeserver="x") is None
    assert worker.sent == [("ctx", {"m": "register_platform", "refused": "matrix"})]
    assert not worker.handles  # nothing of it stays callable from the host


# --- a method added to the contract: written once, it works out of process ----------------------


@pytest.fixture
def widget_contract(monkeypatch):
    """``ctx.register_widget`` declared in the contract and implemented by ``PluginContext`` only, as the
    next Hermes ctx methods will be; the isolated ctx is generated the way the plugin's process does it."""
    from plugin_llm.plugins.isolation import worker

    def register_widget(self, name: str, factory, size: int = 1) -> Any: ...

    seen: list[tuple[Any, ...]] = []

    def implementation(self, name, factory, size=1):
        if not callable(factory):
            raise TypeError(f"plugin {self._key}: register_widget({name!r}): factory must be callable")
        seen.append((name, factory, size))
        return True

    implementation.__name__ = "register_widget"
    monkeypatch.setattr(ctx_api.Ctx, "register_widget", register_widget, raising=False)
    monkeypatch.setattr(ctx_api, "METHODS", (*ctx_api.METHODS, "register_widget"))
    ctx_api.signature_of.cache_clear()
    monkeypatch.setattr(PluginContext, "register_widget", ctx_api.implements(implementation), raising=False)

    class Isolated(RemoteContext):
        __slots__ = ()

    yield worker.forward_the_rest(Isolated), seen
    ctx_api.signature_of.cache_clear()


class _Loopback:
    """A plugin's process whose channel is a function call: requests go (as JSON) to the host's
    ``RemotePlugin``, which applies them through a real in-process ``PluginContext``."""

    def __init__(self, plugin: Any, loading: Any) -> None:
        self.plugin, self.loading = plugin, loading
        self.handles: dict[int, Any] = {}

    def handle(self, fn: Any) -> int:
        self.handles[len(self.handles) + 1] = fn
        return len(self.handles)

    def host(self, method: str, params: Any) -> Any:
        assert method == "ctx"
        return json.loads(json.dumps(self.plugin._on_ctx(self.loading, json.loads(json.dumps(params)))))


def test_a_method_added_to_the_contract_works_out_of_process_without_being_written_again(hermes_home,
                                                                                       widget_contract):
    from types import SimpleNamespace

    from plugin_llm.plugins.isolation.remote import RemotePlugin
    from tests.test_plugins_context import loaded

    isolated_cls, seen = widget_contract
    assert _public(isolated_cls) == _public(PluginContext)
    _, ctxs = loaded(hermes_home, "p")
    in_process = ctxs["p"]
    record = SimpleNamespace(key="p", candidate=SimpleNamespace(path=str(hermes_home), manifest=None))
    host = RemotePlugin(None, record, None)
    host._ctx, host._loading = in_process, object()
    isolated = isolated_cls(_Loopback(host, host._loading), in_process.manifest, hermes_home)

    def factory(colour: str, *, depth: int = 0) -> str:
        return colour

    assert in_process.register_widget("a", factory, size=2) is True
    assert isolated.register_widget("b", factory, 3) is True
    assert isolated.register_widget(name="c", factory=factory) is True
    (_, own, _), (_, proxy, size), (_, _, default) = seen
    assert own is factory and (size, default) == (3, 1)
    assert proxy.__name__ == "widget b (out of process)" and host._slots[0].limited  # under plugins.hook_timeout
    assert [(p.name, p.kind) for p in inspect.signature(proxy).parameters.values()] == [
        ("colour", inspect.Parameter.POSITIONAL_OR_KEYWORD), ("depth", inspect.Parameter.KEYWORD_ONLY)]
    for ctx in (in_process, isolated):  # misuse: the same errors, raised where each carrier raises them
        with pytest.raises(TypeError, match=r"^ctx.register_widget\(\) missing a required argument: 'factory'"):
            ctx.register_widget("d")
        with pytest.raises(TypeError, match="register_widget\\('e'\\): factory must be callable"):
            ctx.register_widget("e", "not callable")
    assert [name for name, _, _ in seen] == ["a", "b", "c"]
    host.stop()
