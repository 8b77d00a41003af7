"""An offline image-generation provider that draws simple SVG sketches.

``ctx.register_image_gen_provider`` takes an object with a ``name`` and a
``generate(prompt, **options)`` method; ``image_gen.provider: sketch`` makes
it the active one. Real providers call an image API here; this one asks the
user's model (``ctx.llm.complete_structured``) to plan the picture as JSON,
then writes an SVG to ``$HERMES_HOME/images/``. No credentials are involved:
the plugin only ever sees the parsed plan.

``/sketch <prompt>`` calls it, e.g. ``/sketch Shape: circle, Colour: teal,
Caption: hello``.
"""

from __future__ import annotations

import hashlib
import os
from html import escape
from pathlib import Path

PLAN_SCHEMA = {
    "type": "object",
    "properties": {
        "shape": {"type": "string", "enum": ["circle", "square", "triangle"]},
        "colour": {"type": "string", "enum": ["teal", "orange", "purple", "grey"]},
        "caption": {"type": "string", "maxLength": 60},
    },
    "required": ["shape", "colour", "caption"],
}

_SHAPES = {
    "circle": '<circle cx="128" cy="110" r="70" fill="{c}"/>',
    "square": '<rect x="58" y="40" width="140" height="140" fill="{c}"/>',
    "triangle": '<polygon points="128,35 203,180 53,180" fill="{c}"/>',
}


class SketchProvider:
    name = "sketch"

    def __init__(self, llm, out_dir: Path) -> None:
        self._llm = llm
        self.out_dir = out_dir

    def generate(self, prompt: str, **options) -> dict:
        plan = self._llm.complete_structured(
            instructions="Plan a simple picture for the prompt: one shape, one colour, a short caption.",
            input=[{"type": "text", "text": prompt}],
            json_schema=PLAN_SCHEMA,
            schema_name="sketch_plan",
            purpose="image_gen.sketch.plan",
        ).parsed or {"shape": "circle", "colour": "grey", "caption": prompt[:60]}
        svg = (
            '<svg xmlns="http://www.w3.org/2000/svg" width="256" height="230">'
            + _SHAPES.get(plan["shape"], _SHAPES["circle"]).format(c=plan["colour"])
            + f'<text x="128" y="215" text-anchor="middle" font-family="sans-serif">{escape(plan["caption"])}</text>'
            + "</svg>\n"
        )
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"sketch-{hashlib.sha256(svg.encode()).hexdigest()[:12]}.svg"
        path.write_text(svg, encoding="utf-8")
        return {"path": str(path), "mime_type": "image/svg+xml", "plan": plan}


def register(ctx):
    home = os.environ.get("HERMES_HOME") or "~/.hermes"
    provider = SketchProvider(ctx.llm, Path(home).expanduser() / "images")
    ctx.register_image_gen_provider(provider)

    def sketch(raw_args: str) -> str:
        if not raw_args.strip():
            return "Usage: /sketch <prompt>"
        result = provider.generate(raw_args.strip())
        return f"{result['path']} ({result['plan']['shape']}, {result['plan']['colour']})"

    ctx.register_command("sketch", sketch, description="draw an SVG sketch", args_hint="<prompt>")
