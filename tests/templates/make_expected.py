#!/usr/bin/env python3
"""Render every chat template in templates/ against every case in cases.json
with the reference (transformers' chat-template renderer over jinja2) and write
expected.json, which tests/unit/tokenizer/template_conformance_test.cpp compares
byte for byte; also renders the one-construct snippets in snippets.json into
snippets_expected.json for tests/unit/tokenizer/template_interpreter_test.cpp.

Requirements: requirements.txt next to this file (jinja2 3.1.6, transformers
5.23.0). Run with the project's reference venv:

    .venv-ref/bin/python tests/templates/make_expected.py

Each record holds the exact variables the template saw (`context`: messages
after transformers' normalisation, tools, documents, add_generation_prompt,
special tokens and extra kwargs), so the C++ side renders the same input.
The script also renders with an independently configured jinja2
ImmutableSandboxedEnvironment (the settings transformers documents) and stops
if the two references disagree.
"""
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers.utils import chat_template_utils as ctu

HERE = os.path.dirname(os.path.abspath(__file__))

# name -> (file, special tokens passed as template variables)
TEMPLATES = {
    "smollm2": ("smollm2.jinja", {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}),
    "llama3": ("llama3.jinja", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "llama3_1": ("llama3_1.jinja", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "qwen2_5": ("qwen2_5.jinja", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "qwen3": ("qwen3.jinja", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "mistral": ("mistral.jinja", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    "gemma": ("gemma.jinja", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}),
}


class GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body (transformers
    uses it only to track assistant-token masks)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


class NoUnderscoreNamespace(jinja2.utils.Namespace):
    """namespace() that refuses underscore-prefixed attributes, as transformers' does."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            NoUnderscoreNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        NoUnderscoreNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"underscore-prefixed namespace attribute {name!r}")


def own_environment(source):
    """jinja2 configured as transformers documents it, without transformers."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = lambda *a, **kw: dict(*a, **kw)
    env.globals["namespace"] = NoUnderscoreNamespace
    return env.from_string(source)


def build_context(case, special_tokens):
    # apply_chat_template drops None-valued message keys, then render_jinja_template
    # copies reasoning fields under their aliases.
    messages = [{k: v for k, v in m.items() if v is not None} for m in case["messages"]]
    messages = ctu._alias_reasoning_fields(messages)
    kwargs = dict(special_tokens)
    kwargs.update(case.get("extra", {}))
    context = {
        "messages": messages,
        "tools": case.get("tools"),
        "documents": None,
        "add_generation_prompt": case["add_generation_prompt"],
    }
    context.update(kwargs)
    return context, kwargs


def render_reference(source, case, special_tokens):
    messages = [{k: v for k, v in m.items() if v is not None} for m in case["messages"]]
    kwargs = dict(special_tokens)
    kwargs.update(case.get("extra", {}))
    out, _ = ctu.render_jinja_template(
        conversations=[messages],
        tools=case.get("tools"),
        documents=None,
        chat_template=source,
        add_generation_prompt=case["add_generation_prompt"],
        **kwargs,
    )
    return out[0]


def outcome(fn):
    try:
        return {"output": fn()}
    except Exception as e:  # the template raised: both sides must fail
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    cases = json.load(open(os.path.join(HERE, "cases.json"), encoding="utf-8"))
    records = []
    for name, (path, special) in TEMPLATES.items():
        source = open(os.path.join(HERE, "templates", path), encoding="utf-8", newline="").read()
        for case in cases:
            context, _ = build_context(case, special)
            ref = outcome(lambda: render_reference(source, case, special))
            own = outcome(lambda: own_environment(source).render(**context))
            if ("error" in ref) != ("error" in own) or ref.get("output") != own.get("output"):
                sys.exit(f"references disagree on {name}/{case['name']}: {ref!r} vs {own!r}")
            records.append({"template": name, "case": case["name"], "context": context, **ref})
    with open(os.path.join(HERE, "expected.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(records, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in r for r in records)
    print(f"wrote {len(records)} records ({n_err} expected errors)")

    # Interpreter snippets (one construct each): transformers' compiled
    # environment and the independent one must agree.
    snippets = json.load(open(os.path.join(HERE, "snippets.json"), encoding="utf-8"))
    out = []
    for sn in snippets:
        ctx = sn.get("context", {})
        ref = outcome(lambda: ctu._compile_jinja_template(sn["template"]).render(**ctx))
        own = outcome(lambda: own_environment(sn["template"]).render(**ctx))
        if ("error" in ref) != ("error" in own) or ref.get("output") != own.get("output"):
            sys.exit(f"references disagree on snippet {sn['name']}: {ref!r} vs {own!r}")
        out.append({"name": sn["name"], "template": sn["template"], "context": ctx, **ref})
    with open(os.path.join(HERE, "snippets_expected.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(out)} snippets ({sum('error' in r for r in out)} expected errors)")


if __name__ == "__main__":
    main()
