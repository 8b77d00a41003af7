"""Provider facts the store needs: usual key variables and keyless providers.

The variable names are litellm's (the first one set wins), so an operator who
already exports ``OPENAI_API_KEY`` for litellm needs no ``auth.json`` at all.
"""

from __future__ import annotations

__all__ = ["ENV_VARS", "KEYLESS_PROVIDERS", "NO_ENV_FALLBACK", "env_vars_for", "normalize_provider"]

#: provider -> environment variables litellm reads for its key, in order.
ENV_VARS: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "openrouter": ("OPENROUTER_API_KEY", "OR_API_KEY"),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "groq": ("GROQ_API_KEY",),
    "mistral": ("MISTRAL_API_KEY",),
    "codestral": ("CODESTRAL_API_KEY",),
    "deepseek": ("DEEPSEEK_API_KEY",),
    "xai": ("XAI_API_KEY",),
    "together_ai": ("TOGETHERAI_API_KEY", "TOGETHER_AI_API_KEY", "TOGETHER_API_KEY"),
    "togetherai": ("TOGETHERAI_API_KEY", "TOGETHER_AI_API_KEY", "TOGETHER_API_KEY"),
    "cohere": ("COHERE_API_KEY", "CO_API_KEY"),
    "cohere_chat": ("COHERE_API_KEY", "CO_API_KEY"),
    "perplexity": ("PERPLEXITYAI_API_KEY", "PERPLEXITY_API_KEY"),
    "fireworks_ai": ("FIREWORKS_AI_API_KEY", "FIREWORKS_API_KEY", "FIREWORKSAI_API_KEY"),
    "deepinfra": ("DEEPINFRA_API_KEY",),
    "azure": ("AZURE_API_KEY", "AZURE_OPENAI_API_KEY"),
    "azure_ai": ("AZURE_AI_API_KEY",),
    "huggingface": ("HUGGINGFACE_API_KEY", "HF_TOKEN"),
    "replicate": ("REPLICATE_API_KEY",),
    "cerebras": ("CEREBRAS_API_KEY",),
    "sambanova": ("SAMBANOVA_API_KEY",),
    "nvidia_nim": ("NVIDIA_NIM_API_KEY",),
    "ai21": ("AI21_API_KEY",),
    "anyscale": ("ANYSCALE_API_KEY",),
    "voyage": ("VOYAGE_API_KEY",),
    "dashscope": ("DASHSCOPE_API_KEY",),
    "moonshot": ("MOONSHOT_API_KEY",),
    "nebius": ("NEBIUS_API_KEY",),
    "hyperbolic": ("HYPERBOLIC_API_KEY",),
    "watsonx": ("WATSONX_API_KEY", "WX_API_KEY"),
    "ollama": ("OLLAMA_API_KEY",),
    "ollama_chat": ("OLLAMA_API_KEY",),
    "hosted_vllm": ("HOSTED_VLLM_API_KEY",),
    "litellm_proxy": ("LITELLM_PROXY_API_KEY",),
}

#: Providers that work without any key (local servers, the embedded model, an
#: operator's own OpenAI-compatible endpoint). A key is still used if configured.
KEYLESS_PROVIDERS = frozenset(
    {"local", "custom", "ollama", "ollama_chat", "lm_studio", "llamafile", "hosted_vllm", "vllm", "xinference"}
)

#: Providers with no "usual" environment variable: never guess one for them.
NO_ENV_FALLBACK = frozenset({"local", "custom"})


def normalize_provider(provider: str) -> str:
    """Provider names are compared trimmed and lower-case (``OpenAI`` == ``openai``)."""
    return provider.strip().lower()


def env_vars_for(provider: str) -> tuple[str, ...]:
    """The environment variables holding ``provider``'s key (litellm's names).

    Unknown providers get ``<PROVIDER>_API_KEY`` (``-`` and ``.`` become ``_``);
    ``local`` and ``custom`` get none.
    """
    if provider in NO_ENV_FALLBACK:
        return ()
    known = ENV_VARS.get(provider)
    if known is not None:
        return known
    return (provider.upper().replace("-", "_").replace(".", "_") + "_API_KEY",)
