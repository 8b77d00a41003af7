"""An isolated plugin's ``ctx`` calls, applied on the host through its real ``PluginContext``.

The child binds each call against :mod:`..ctx_api` and sends it by name; the host's own
``PluginContext`` method binds and checks it again, so registries, validation, refusals and
dispatch are those of an in-process plugin. The plugin's callables become proxies (a :class:`_Slot`
each, run by :meth:`.host_calls.HostCallsMixin.invoke`), a provider object a stand-in of the same
base class. After a restart the child registers again, and its new handles are mapped onto the
first start's registrations. A mixin of :class:`.remote.RemotePlugin`.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable

from auth.redaction import redact
from .. import ctx_api
from ..lifecycle import PluginRegistration
from ..registry import Disposable
from ..hook_limits import mark_self_limited
from ..untrusted import bounded, error_text
from .host_process import _Child
from .protocol import decode_value, encode_value


class _Slot:
    """One registered callable of the plugin: what it is and the current child's handle for it."""

    __slots__ = ("kind", "name", "what", "limited", "handle")

    def __init__(self, kind: str, name: str, what: str, limited: bool, handle: int) -> None:
        self.kind, self.name, self.what, self.limited, self.handle = kind, name, what, limited, handle


def _proxy_signature(sig: Any) -> inspect.Signature:
    if sig is None:
        return inspect.Signature([inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                                  inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])
    if type(sig) is not list or len(sig) > 100:
        raise ValueError("malformed signature")
    params = []
    for item in sig:
        if type(item) is not list or len(item) != 3 or type(item[0]) is not str or type(item[1]) is not int:
            raise ValueError("malformed signature")
        kind = inspect._ParameterKind(item[1])
        default = None if item[2] is True else inspect.Parameter.empty
        params.append(inspect.Parameter(item[0], kind, default=default))
    return inspect.Signature(params, __validate_parameters__=False)


class HostCtxMixin:
    """Applying the child's ``ctx`` calls and registrations.

    The state it uses (made by ``RemotePlugin.__init__``): ``key``, ``_ctx``, ``_slots``, ``_answers``,
    ``_registrations``, ``_replay``, ``_loading``, ``_restart_slot``.
    """

    def _on_ctx(self, child: _Child, params: dict[str, Any]) -> Any:
        """A ``ctx`` call of the plugin, its arguments bound by name in its process (:mod:`..ctx_api`),
        applied through the host's own ``PluginContext`` method, which binds and checks them again."""
        method = params.get("m")
        if type(method) is not str or method in ctx_api.LOCAL or (
                method not in ctx_api.METHODS and method not in ctx_api.PROPERTIES):
            raise ValueError(f"unknown ctx operation {bounded(str(method), 40)!r}")
        if method in ctx_api.PROPERTIES:
            return {"v": encode_value(getattr(self._ctx, method), strict=True)}
        encoded = params.get("a") if type(params.get("a")) is dict else {}
        if not ctx_api.is_registration(method):
            result = getattr(self._ctx, method)(**ctx_api.spread(method, decode_value(encoded)))
            return {"v": encode_value(result, strict=True)}
        if child is not self._loading:
            raise RuntimeError(f"plugin {self.key}: registering after register(ctx) returned is not supported "
                               "out of process")
        label = _label(params.get("refused") if method in ctx_api.NOT_ACROSS else next(iter(encoded.values()), None))
        if self._replay is not None:  # a restart: the registrations exist; map the new handles onto them
            return self._replay_register(method, label, encoded)
        before = len(self._slots)
        try:
            answer = self._register(method, label, encoded, params.get("sig"))
        except Exception as exc:  # refused by the host's checks: no proxy kept; a restart raises it again
            del self._slots[before:]
            self._answers.append((method, label, exc))
            raise
        self._answers.append((method, label, answer))
        return answer

    def _on_registration(self, params: dict[str, Any]) -> Any:
        """``handle.active`` / ``handle.dispose()`` of a registration's handle in the plugin's process."""
        number, op = params.get("h"), params.get("op")
        if type(number) is not int or not 0 <= number < len(self._registrations) or op not in ("active", "dispose"):
            raise ValueError("unknown registration handle")
        handle = self._registrations[number]
        if op == "dispose":
            handle.dispose()
        return {"active": bool(handle.active)}

    def _replay_register(self, method: str, label: str, encoded: dict[str, Any]) -> Any:
        index = len(self._answers)
        replay = self._replay or []
        if index >= len(replay) or replay[index][:2] != (method, label):
            raise RuntimeError(f"plugin {self.key}: after a restart it called ctx.{method}({label!r}), "
                               "which its first start did not (in this order)")
        self._answers.append(replay[index])
        answer = replay[index][2]
        if isinstance(answer, Exception):
            raise answer.with_traceback(None)
        handles: list[int] = []
        decode_value(encoded, handles.append)  # in the order the first start made proxies of them
        if self._restart_slot + len(handles) > len(self._slots):
            raise RuntimeError(f"plugin {self.key}: after a restart ctx.{method}({label!r}) passed other callables "
                               "than at its first start")
        for handle in handles:
            slot = self._slots[self._restart_slot]
            slot.handle = handle
            self._restart_slot += 1
        return answer

    def _proxy(self, spec: Any, kind: str, name: str, what: str, limited: bool) -> Callable[..., Any]:
        if type(spec) is not dict or type(spec.get("h")) is not int:
            raise TypeError(f"plugin {self.key}: {what}: a callable was expected")
        index = len(self._slots)
        slot = _Slot(kind, name, what, limited, spec["h"])
        self._slots.append(slot)

        def proxy(*args: Any, **kwargs: Any) -> Any:
            return self.invoke(index, args, kwargs)

        proxy.__signature__ = _proxy_signature(spec.get("sig"))  # type: ignore[attr-defined]
        proxy.__name__ = proxy.__qualname__ = f"{what} (out of process)"
        return mark_self_limited(proxy) if limited else proxy

    def _register(self, method: str, label: str, encoded: dict[str, Any], signatures: Any) -> Any:
        """Apply one registration: the plugin's callables become proxies, a provider a stand-in."""
        ctx = self._ctx
        if method in ctx_api.NOT_ACROSS:
            ctx._refuse(f"ctx.{method}({bounded(label, 60)!r}) is not available to a plugin running out of process "
                        f"({ctx_api.NOT_ACROSS[method]}; plugins.entries.{self.key}.isolation: process): ignored; "
                        "run the plugin in process to use it")
            return {"v": None}
        signatures = signatures if type(signatures) is dict else {}
        noun = method.removeprefix("register_").replace("_", " ")
        provider = ctx_api.PROVIDER_PARAMS.get(method)
        made: list[int] = []
        named: dict[str, Any] = {}
        for param, value in encoded.items():
            if param == provider:
                named[param] = self._stand_in(method, value, signatures)
                continue
            timed = (method, param) not in ctx_api.UNTIMED

            def proxy(handle: int, param: str = param, timed: bool = timed) -> Callable[..., Any]:
                what = f"{noun} {label}" if not made else f"{noun} {label} {param}"
                made.append(handle)
                return self._proxy({"h": handle, "sig": signatures.get(str(handle))}, method, label, what, timed)

            named[param] = decode_value(value, proxy)
        named.update(ctx_api.SET_ON_HOST.get(method, {}))
        if method == "register_cli_command":
            named["setup_fn"] = self._cli_setup(label, named.get("setup_fn"))
        answer = _reply(getattr(ctx, method)(**ctx_api.spread(method, named)))
        if answer.get("entry") is True and answer.get("handle") is not None:  # the plugin may dispose of it
            self._registrations.append(answer.pop("handle"))
            answer["h"] = len(self._registrations) - 1
        return answer

    def _stand_in(self, method: str, f: Any, signatures: dict[str, Any]) -> Any:
        """A memory provider, context engine or image generator: a stand-in of the same base class
        whose public methods run the plugin's in its process (each under ``plugins.hook_timeout``)."""
        bases: dict[tuple[str, str], Callable[[], type]] = {
            ("register_memory_provider", "host"): lambda: __import__(
                "plugin_llm.plugins.engines", fromlist=["x"]).MemoryProvider,
            ("register_context_engine", "host"): lambda: __import__(
                "plugin_llm.plugins.engines", fromlist=["x"]).ContextEngine,
            ("register_memory_provider", "hermes"): lambda: __import__(
                "plugin_llm.compat.hermes.agent.memory_provider", fromlist=["x"]).MemoryProvider,
            ("register_context_engine", "hermes"): lambda: __import__(
                "plugin_llm.compat.hermes.agent.context_engine", fromlist=["x"]).ContextEngine,
        }
        f = f if type(f) is dict else {}
        make_base = bases.get((method, f.get("base") or ""), lambda: object)
        methods = f.get("methods") if type(f.get("methods")) is dict else {}
        attrs = f.get("attrs") if type(f.get("attrs")) is dict else {}
        if len(methods) > 200 or len(attrs) > 200:
            raise ValueError(f"plugin {self.key}: malformed {bounded(method, 40)} registration")
        namespace: dict[str, Any] = {k: v for k, v in attrs.items()
                                     if type(k) is str and k.isidentifier() and not k.startswith("_")
                                     and (v is None or type(v) in (str, int, float, bool))}
        kind = method.removeprefix("register_")
        for mname, spec in methods.items():
            if type(mname) is not str or not mname.isidentifier() or mname.startswith("_"):
                raise ValueError(f"plugin {self.key}: malformed {kind} method name")
            handle = spec.get("id") if type(spec) is dict and spec.get("$t") == "fn" else None
            if type(handle) is not int:
                raise ValueError(f"plugin {self.key}: malformed {kind} method {bounded(mname, 60)!r}")
            proxy = self._proxy({"h": handle, "sig": signatures.get(str(handle))}, method, mname,
                                f"{kind.replace('_', ' ')} {mname}", limited=True)
            namespace[mname] = _method(proxy)
        class_name = f.get("class") if type(f.get("class")) is str and f["class"].isidentifier() else "Provider"
        namespace["__module__"] = f"plugin (out of process: {self.key})"
        cls = type(class_name[:100], (make_base(),), namespace)
        return cls if f.get("is_class") is True else cls()

    def _cli_setup(self, shown: str, runner: Any) -> Any:
        """``plugin-llm <name>``: the host hands the raw arguments to the plugin's process, which parses
        them with the plugin's own ``setup_fn`` (a parser cannot cross the channel) and runs it."""
        if not callable(runner):  # not a callable: register_cli_command refuses it, as in process
            return runner
        key = self.key

        def run_raw(argv: list[str], debug: bool = False) -> int:
            try:
                reply = runner(list(argv))
            except Exception as exc:
                if debug:
                    raise
                print(f"plugin-llm {shown}: error: {redact(error_text(exc))} (plugin {key})", file=sys.stderr)
                return 1
            reply = reply if type(reply) is dict else {}
            for stream, text in ((sys.stdout, reply.get("out")), (sys.stderr, reply.get("err"))):
                if type(text) is str and text:
                    stream.write(text)
                    stream.flush()
            code = reply.get("code")
            code = code if type(code) is int else 1
            if reply.get("exit") is True:  # argparse exited (--help, a usage error): as it does in process
                raise SystemExit(code)
            return code

        def setup(parser: Any) -> None:  # the plugin's setup_fn runs in its process (see run_raw)
            return None

        setup.plugin_llm_raw_argv = run_raw  # type: ignore[attr-defined]
        return setup


def _reply(result: Any) -> dict[str, Any]:
    """A registration's answer for the plugin: plain values as they are, a registry entry as "registered"
    (a disposable handle is kept: the plugin's process refers to it by number)."""
    if result is None or type(result) in (bool, int, float, str):
        return {"v": result}

    return {"entry": True, "handle": result if isinstance(result, (PluginRegistration, Disposable)) else None}


def _label(value: Any) -> str:
    """What a registration registers, as its first argument names it (a provider: its class name)."""
    if type(value) is dict and type(value.get("class")) is str:
        value = value["class"]
    return bounded(value, 100) if type(value) is str else type(value).__name__


def _method(proxy: Callable[..., Any]) -> Callable[..., Any]:
    """``proxy`` as a method of a stand-in class (``self`` dropped; the signature is the remote one)."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return proxy(*args, **kwargs)

    signature = inspect.signature(proxy)
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *signature.parameters.values()]
    method.__signature__ = inspect.Signature(params, __validate_parameters__=False)  # type: ignore[attr-defined]
    method.__name__ = method.__qualname__ = proxy.__name__
    return method
