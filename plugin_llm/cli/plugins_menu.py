"""The interactive ``plugin-llm plugins`` screen: a checklist of general plugins plus
single-choice pickers for the memory provider and the context engine.

``run_menu(model)`` edits a :class:`~plugin_llm.cli.plugins_select.MenuModel`
in place and returns True when the operator confirmed (the caller saves through
``config_edit``). It uses curses when it can and falls back to numbered prompts
(no curses module, or a terminal curses cannot drive).

Keys (curses): up/down (or k/j) move, space toggles a plugin (or opens a
picker), enter opens a picker on a provider row and saves elsewhere, q or Esc
leaves without saving.

Labels hold plugin keys and manifest descriptions: they are shown through
:func:`~plugin_llm.cli._common.printable` (no raw control characters, bounded).
"""

from __future__ import annotations

from typing import Any, Callable

from plugin_llm.cli._common import printable
from plugin_llm.cli.plugins_select import MenuModel, Picker

__all__ = ["run_menu", "prompt_menu", "curses_menu"]

_HELP = "↑↓ move  SPACE toggle  ENTER choose/save  q/ESC cancel"


def run_menu(model: MenuModel) -> bool:
    try:
        import curses  # noqa: F401
    except ImportError:
        return prompt_menu(model)
    try:
        return curses_menu(model)
    except Exception as exc:  # curses.error: a terminal curses cannot drive (TERM=dumb, ...)
        if type(exc).__name__ != "error":
            raise
        return prompt_menu(model)


# --------------------------------------------------------------------------- curses


def _rows(model: MenuModel) -> list[tuple[str, Any]]:
    """(kind, payload) per line: headers, plugin items, picker rows, blank lines."""
    rows: list[tuple[str, Any]] = [("header", "General plugins")]
    if model.general:
        rows += [("item", item) for item in model.general]
    else:
        rows.append(("text", "  (no general plugins installed)"))
    rows += [("blank", None), ("header", "Provider plugins")]
    rows += [("picker", model.memory), ("picker", model.context)]
    return rows


def curses_menu(model: MenuModel) -> bool:  # pragma: no cover - needs a terminal
    import os

    os.environ.setdefault("ESCDELAY", "25")  # Esc cancels at once, not after curses' default 1 s
    import curses

    def main(screen: Any) -> bool:
        curses.curs_set(0)
        screen.keypad(True)
        rows = _rows(model)
        selectable = [i for i, (kind, _) in enumerate(rows) if kind in ("item", "picker")]
        pos = 0
        top = 0
        while True:
            screen.erase()
            height, width = screen.getmaxyx()
            screen.addnstr(0, 0, "Plugins", width - 1, curses.A_BOLD)
            screen.addnstr(1, 0, _HELP, width - 1, curses.A_DIM)
            body = max(1, height - 4)
            current = selectable[pos]
            if current < top:
                top = current
            elif current >= top + body:
                top = current - body + 1
            for line, (kind, payload) in enumerate(rows[top : top + body]):
                index = top + line
                attr = curses.A_REVERSE if index == current else curses.A_NORMAL
                pointer = "→" if index == current else " "
                if kind == "header":
                    text, attr = f"  {payload}", curses.A_BOLD
                elif kind == "item":
                    text = f" {pointer} [{'✓' if payload.checked else ' '}] {printable(payload.label, 300)}"
                elif kind == "picker":
                    text = f" {pointer}     {payload.title:<20} ▸ {printable(payload.current.label, 300)}"
                else:
                    text = payload or ""
                screen.addnstr(3 + line, 0, text, width - 1, attr)
            changed = " (changed)" if model.changed() else ""
            screen.addnstr(height - 1, 0, f"ENTER on a plugin saves{changed}", width - 1, curses.A_DIM)
            key = screen.getch()
            kind, payload = rows[current]
            if key in (curses.KEY_UP, ord("k")):
                pos = (pos - 1) % len(selectable)
            elif key in (curses.KEY_DOWN, ord("j")):
                pos = (pos + 1) % len(selectable)
            elif key == ord(" ") and kind == "item":
                payload.checked = not payload.checked
            elif key in (ord(" "), 10, 13, curses.KEY_ENTER) and kind == "picker":
                _curses_picker(screen, payload)
            elif key in (10, 13, curses.KEY_ENTER):
                return True
            elif key in (27, ord("q")):
                return False

    return bool(curses.wrapper(main))


def _curses_picker(screen: Any, picker: Picker) -> None:  # pragma: no cover - needs a terminal
    import curses

    pos = picker.selected
    while True:
        screen.erase()
        height, width = screen.getmaxyx()
        screen.addnstr(0, 0, picker.title, width - 1, curses.A_BOLD)
        screen.addnstr(1, 0, "↑↓ move  ENTER/SPACE select  ESC back", width - 1, curses.A_DIM)
        for i, choice in enumerate(picker.choices[: max(1, height - 3)]):
            mark = "(•)" if i == picker.selected else "( )"
            attr = curses.A_REVERSE if i == pos else curses.A_NORMAL
            screen.addnstr(3 + i, 0, f" {mark} {printable(choice.label, 300)}", width - 1, attr)
        key = screen.getch()
        if key in (curses.KEY_UP, ord("k")):
            pos = (pos - 1) % len(picker.choices)
        elif key in (curses.KEY_DOWN, ord("j")):
            pos = (pos + 1) % len(picker.choices)
        elif key in (ord(" "), 10, 13, curses.KEY_ENTER):
            picker.selected = pos
            return
        elif key in (27, ord("q")):
            return


# --------------------------------------------------------------------------- numbered prompts


def prompt_menu(
    model: MenuModel,
    input_fn: Callable[[str], str] = input,
    print_fn: Callable[[str], None] = print,
) -> bool:
    """The fallback: numbered list, toggle by number, ``m``/``c`` pick providers, ``s`` saves."""
    while True:
        print_fn("General plugins:")
        if not model.general:
            print_fn("   (no general plugins installed)")
        for i, item in enumerate(model.general, 1):
            print_fn(f"  {i:>2}. [{'x' if item.checked else ' '}] {printable(item.label, 300)}")
        print_fn(f"   m. Memory provider  ▸ {printable(model.memory.current.label, 300)}")
        print_fn(f"   c. Context engine   ▸ {printable(model.context.current.label, 300)}")
        try:
            answer = input_fn("Toggle numbers (e.g. '1 3'), m/c to pick a provider, s to save, q to quit: ").strip().lower()
        except EOFError:
            return False
        if answer in ("s", "save"):
            return True
        if answer in ("q", "quit", "exit"):
            return False
        if answer in ("m", "c"):
            _prompt_picker(model.memory if answer == "m" else model.context, input_fn, print_fn)
            continue
        for token in answer.replace(",", " ").split():
            if token.isdigit() and 1 <= int(token) <= len(model.general):
                item = model.general[int(token) - 1]
                item.checked = not item.checked
            else:
                print_fn(f"  ignored {token!r}: not a plugin number")


def _prompt_picker(picker: Picker, input_fn: Callable[[str], str], print_fn: Callable[[str], None]) -> None:
    print_fn(f"{picker.title}:")
    for i, choice in enumerate(picker.choices, 1):
        print_fn(f"  {i:>2}. ({'•' if i - 1 == picker.selected else ' '}) {printable(choice.label, 300)}")
    try:
        answer = input_fn("Number (enter keeps the current one): ").strip()
    except EOFError:
        return
    if answer.isdigit() and 1 <= int(answer) <= len(picker.choices):
        picker.selected = int(answer) - 1
    elif answer:
        print_fn(f"  ignored {answer!r}: not a choice number")
