"""How tight a limited call's input reservation is, and what counting it exactly costs.

For a few realistic prompts to gpt-4o (o200k_base): the input tokens reserved by the byte bound
(``pricing.input_token_bound``) and by the exact count (``limits.tokens.count_input``), each as a
ratio to the real count (OpenAI's cookbook ``num_tokens_from_messages``, and ``num_tokens_for_tools``
for a request with tools, computed with tiktoken from the same files); then the time of one count,
exact and bound, interleaved in this run, as a ratio; the worst text at the size cap; and the
one-time load of each encoding in this process. Printed, not asserted:
``python benchmarks/bench_reservation.py [--quick]``. Method: docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plugin_llm.limits import tokens  # noqa: E402
from plugin_llm.limits.pricing import input_token_bound  # noqa: E402

ENGLISH = ("The quarterly report shows that revenue grew by eight percent while operating costs stayed flat. "
           "The board asked for a summary of the main risks, the hiring plan for the next two quarters and the "
           "cash position, with the numbers exact and the tone neutral. ")
CODE = '''def settle(self, usage=None, *, cost_usd=None):
    """Replace the reservation by what the request used."""
    if self.done:
        return
    ins = usage.input_tokens if usage is not None else 0
    for window in ("minute", "day", "month"):
        self.windows[window] -= self.reserved - ins  # give back what was not used
    return {"settled": ins, "windows": sorted(self.windows)}
'''
GERMAN = ("Der Quartalsbericht zeigt, dass der Umsatz um acht Prozent gestiegen ist, während die Betriebskosten "
          "unverändert blieben. Bitte fasse die wichtigsten Risiken in drei Stichpunkten zusammen. ")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a given city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. San Francisco."},
        "unit": {"type": "string", "description": "The temperature unit.", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_docs", "description": "Search the product documentation.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to look for."},
            "limit": {"type": "integer", "description": "How many results to return."}}}}}]
SYSTEM = {"role": "system", "content": "You are a careful assistant. Answer briefly and cite the figures you use."}

PROMPTS = {
    "short question": ([SYSTEM, {"role": "user", "content": "What is the capital of Australia?"}], ()),
    "summarise 4 KB": ([SYSTEM, {"role": "user", "content": "Summarise:\n\n" + ENGLISH * 16}], ()),
    "review code": ([SYSTEM, {"role": "user", "content": "Review this code:\n\n" + CODE * 8}], ()),
    "chat, 12 turns": ([SYSTEM] + [{"role": ("user", "assistant")[i % 2], "content": ENGLISH[: 60 + 17 * i]}
                                   for i in range(12)], ()),
    "German 3 KB": ([SYSTEM, {"role": "user", "content": GERMAN * 16}], ()),
    "tools": ([SYSTEM, {"role": "user", "content": "Weather in Paris, and the docs on leases?"}], (TOOLS,)),
    "summarise 30 KB": ([SYSTEM, {"role": "user", "content": "Summarise:\n\n" + ENGLISH * 120}], ()),
    "summarise 60 KB": ([SYSTEM, {"role": "user", "content": "Summarise:\n\n" + ENGLISH * 240}], ()),
}
#: the slowest text per byte for the BPE (long runs), at the size counted exactly
_SIZE = tokens.MAX_EXACT_BYTES - 256
WORST = {"spaces": " " * _SIZE, "one letter": "a" * _SIZE, "random ASCII": "".join(
    chr(33 + (i * 7919) % 94) for i in range(_SIZE)), "emoji": "\U0001F600" * (_SIZE // 4)}


def cookbook_messages(encoding, messages) -> int:
    """OpenAI cookbook, num_tokens_from_messages for gpt-4o: 3 per message, 1 per name, 3 for the reply."""
    total = 3
    for message in messages:
        total += 3
        for key, value in message.items():
            total += len(encoding.encode(value))
            total += 1 if key == "name" else 0
    return total


def cookbook_tools(encoding, functions) -> int:
    """OpenAI cookbook, num_tokens_for_tools for gpt-4o (the functions' share)."""
    func_init, prop_init, prop_key, enum_init, enum_item, func_end = 7, 3, 3, -3, 3, 12
    total = 0
    for tool in functions:
        function = tool["function"]
        total += func_init + len(encoding.encode(function["name"] + ":" + function["description"].rstrip(".")))
        properties = function["parameters"]["properties"]
        if properties:
            total += prop_init
            for key, spec in properties.items():
                total += prop_key
                if "enum" in spec:
                    total += enum_init + sum(enum_item + len(encoding.encode(item)) for item in spec["enum"])
                total += len(encoding.encode(f"{key}:{spec['type']}:{spec['description'].rstrip('.')}"))
    return total + func_end if functions else 0


def per_call(fn, repeat: int, blocks: int) -> list[float]:
    """Seconds per call of ``fn()``, one value per block."""
    out = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        out.append((time.perf_counter() - start) / repeat)
    return out


def interleaved(a, b, repeat: int, rounds: int) -> tuple[float, float]:
    """Median seconds per call of ``a`` and ``b``, measured in alternating blocks."""
    times_a, times_b = [], []
    for _ in range(rounds):
        times_a += per_call(a, repeat, 1)
        times_b += per_call(b, repeat, 1)
    return statistics.median(times_a), statistics.median(times_b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    rounds = 5 if args.quick else 15

    import tiktoken

    started = time.perf_counter()
    encoding = tokens.wait(tokens.O200K, 120)
    first = time.perf_counter() - started
    tokens.wait(tokens.CL100K, 120)
    if encoding is None:
        sys.exit("the o200k_base file bundled with litellm did not load (see the log)")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(tokens._tokenizers_dir())  # tiktoken's own loader: the same files
    reference = tiktoken.get_encoding(tokens.O200K)

    print(f"one-time load in this process: o200k_base {tokens.load_seconds(tokens.O200K):.2f} s, cl100k_base "
          f"{tokens.load_seconds(tokens.CL100K):.2f} s (in a background thread; the first call waited {first:.2f} s "
          "here only because it asked to)\n")
    print(f"{'prompt':<16} {'real':>6} {'bound':>7} {'/real':>6} {'exact':>7} {'/real':>6} "
          f"{'bound us':>9} {'exact us':>9} {'x bound':>8}")
    for name, (messages, extra) in PROMPTS.items():
        real = cookbook_messages(reference, messages) + sum(cookbook_tools(reference, tools) for tools in extra)
        bound = input_token_bound(messages, extra)
        exact, is_exact = tokens.count_input(tokens.O200K, messages, extra)
        size = sum(len(m["content"].encode()) for m in messages)
        repeat = max(5, min(2000, 400_000 // max(1, size)))
        t_bound, t_exact = interleaved(lambda: input_token_bound(messages, extra),
                                       lambda: tokens.count_input(tokens.O200K, messages, extra), repeat, rounds)
        flag = "" if is_exact else " (bound: past the cap)"
        print(f"{name:<16} {real:>6} {bound:>7} {bound / real:>6.2f} {exact:>7} {exact / real:>6.3f} "
              f"{t_bound * 1e6:>9.1f} {t_exact * 1e6:>9.1f} {t_exact / t_bound:>8.0f}{flag}")

    print(f"\nthe slowest text at the cap ({tokens.MAX_EXACT_BYTES // 1024} KiB counted exactly), per call:")
    for name, text in WORST.items():
        messages = [{"role": "user", "content": text}]
        t_bound, t_exact = interleaved(lambda: input_token_bound(messages),
                                       lambda: tokens.count_input(tokens.O200K, messages), 3, max(3, rounds // 3))
        print(f"  {name:<12} bound {t_bound * 1e6:8.1f} us   exact {t_exact * 1e3:6.2f} ms   x{t_exact / t_bound:,.0f}")
    past = [{"role": "user", "content": ENGLISH * 2000}]  # 470 KB: past the cap, the bound
    t_bound, t_exact = interleaved(lambda: input_token_bound(past), lambda: tokens.count_input(tokens.O200K, past),
                                   3, max(3, rounds // 3))
    print(f"  past the cap (470 KB): bound {t_bound * 1e6:.1f} us, count_input {t_exact * 1e6:.1f} us "
          f"(x{t_exact / t_bound:.1f}): the bound")


if __name__ == "__main__":
    main()
