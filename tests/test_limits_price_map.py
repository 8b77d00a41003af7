"""Admission prices models from litellm's bundled price map read as JSON: the same numbers litellm
reports, without importing litellm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_llm.limits.pricing import _INPUT_PRICE, _OUTPUT_PRICE, find_price
from plugin_llm.limits.settings import NANO

ROOT = Path(__file__).resolve().parents[1]
MODELS = [("openai", "gpt-4o"), ("openai", "gpt-4o-mini"), ("anthropic", "claude-sonnet-4-6"),
          ("gemini", "gemini-2.5-pro")]


@pytest.mark.slow
@pytest.mark.parametrize(("provider", "model"), MODELS)
def test_map_prices_are_litellms(provider: str, model: str) -> None:
    from plugin_llm.transport._loading import load_litellm

    litellm = load_litellm()
    entry = litellm.model_cost.get(f"{provider}/{model}") or litellm.model_cost[model]
    price = find_price(provider, model, {})
    assert price is not None
    # admission reserves at the highest tier (long-context input, cache writes): litellm's own numbers
    highest_in = max(v for k, v in entry.items() if _INPUT_PRICE.match(k))
    highest_out = max(v for k, v in entry.items() if _OUTPUT_PRICE.match(k))
    assert price.input_nano == pytest.approx(highest_in * NANO, rel=1e-12)
    assert price.output_nano == pytest.approx(highest_out * NANO, rel=1e-12)
    assert price.max_output_tokens == entry.get("max_output_tokens")


@pytest.mark.slow
def test_pricing_does_not_import_litellm() -> None:
    script = ("import sys\nfrom plugin_llm.limits.pricing import _INPUT_PRICE, _OUTPUT_PRICE, find_price\n"
              "assert find_price('openai', 'gpt-4o', {}) is not None\nprint('litellm' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
