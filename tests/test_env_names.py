"""The one rule for provider variables (auth.env_names), checked against litellm's own source."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from auth.env_names import is_credential_name, litellm_providers, provider_names, steering_reason
from auth.providers import env_vars_for

#: a name litellm reads as a key, secret, endpoint, proxy or CA setting
_SHAPED = re.compile(r"^[A-Z0-9_]*(API_?KEY|_API_BASE|_BASE_URL|_TOKEN|_SECRET|_SECRET_KEY|_ACCESS_KEY_ID|_PROXY"
                     r"|_CA_BUNDLE|_CREDENTIALS|_ENDPOINT|_PASSWORD)$")
_READ = re.compile(r"""(?:get_secret(?:_str|_bool)?|os\.environ\.get|os\.getenv|os\.environ\[)\(?\s*["']([A-Z][A-Z0-9_]+)["']""")


def _litellm_dir() -> Path:
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.submodule_search_locations, "litellm is a dependency of the host"
    return Path(next(iter(spec.submodule_search_locations)))


def _litellm_env_names() -> set[str]:
    """The variable names litellm's provider code reads (text scan, no import)."""
    root = _litellm_dir()
    names: set[str] = set()
    for path in [*(root / "llms").rglob("*.py"), root / "main.py", root / "utils.py"]:
        names.update(_READ.findall(path.read_text(encoding="utf-8", errors="replace")))
    providers = root / "llms" / "openai_like" / "providers.json"
    if providers.is_file():
        for entry in json.loads(providers.read_text(encoding="utf-8")).values():
            names.update(v for k, v in entry.items() if k.endswith("_env") and isinstance(v, str))
    return names


def test_every_key_endpoint_and_proxy_variable_litellm_reads_is_refused_to_plugins():
    shaped = sorted(n for n in _litellm_env_names() if _SHAPED.match(n))
    assert len(shaped) > 100  # the scan found litellm's variables
    assert [n for n in shaped if steering_reason(n) is None] == []


def test_every_provider_key_variable_the_store_reads_is_a_credential():
    assert len(litellm_providers()) > 50
    for provider in provider_names():
        for name in env_vars_for(provider):
            assert steering_reason(name) is not None, name
            assert is_credential_name(name), name


@pytest.mark.parametrize("name", ["DEEPSEEK_API_BASE", "NOVITA_API_KEY", "HTTPS_PROXY", "https_proxy", "all_proxy",
                                  "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
                                  "FOO_BASE_URL", "FOO_API_BASE", "FOO_API_KEY", "FOO_KEY_FILE", "FOO_CREDENTIALS",
                                  "FOO_SECRET_ACCESS_KEY", "FOO_ACCESS_TOKEN", "AWS_PROFILE", "AZURE_CLIENT_SECRET",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "WATSONX_PROJECT_ID", "LITELLM_LOCAL_MODEL_COST_MAP"])
def test_steering_variables_are_refused_by_rule(name):
    assert steering_reason(name) is not None


@pytest.mark.parametrize("name", ["MY_PLUGIN_REGION", "WEATHER_UNITS", "LOG_LEVEL", "TZ"])
def test_ordinary_variables_may_be_set(name):
    assert steering_reason(name) is None


def test_reading_keeps_a_plugins_own_key_and_withholds_provider_keys():
    assert not is_credential_name("MY_SERVICE_API_KEY") and not is_credential_name("PROBE_PLUGIN_TOKEN")
    for name in ("NOVITA_API_KEY", "LM_STUDIO_API_KEY", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "GITHUB_TOKEN",
                 "HTTP_PROXY"):
        assert is_credential_name(name), name
    assert is_credential_name("MY_ROUTE_KEY", key_names=["MY_ROUTE_KEY"])  # auth.json's key_env
    assert is_credential_name("ACME_API_KEY", providers=["acme"])  # a provider auth.json names


def test_the_rule_does_not_import_litellm():
    code = ("import sys; from auth.env_names import steering_reason, is_credential_name; "
            "steering_reason('NOVITA_API_KEY'); is_credential_name('X'); print('litellm' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.stdout.strip() == "False", done.stderr
