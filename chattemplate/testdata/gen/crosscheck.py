"""Cross-check the fixtures against Python's jinja2, the engine vLLM uses.

gen.mjs renders the fixtures with @huggingface/jinja. This script takes the
same template contexts (node gen.mjs --contexts) and renders them with
jinja2 set up as transformers sets it up, then reports every case where
the two engines disagree. It changes no file.

Usage (from this directory, after npm ci): python3 crosscheck.py
Needs jinja2 (3.1.x).
"""

import json
import subprocess
import sys
from datetime import datetime

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def cut(rendered, final):
    """transformers' continue_final_message truncation."""
    if final.strip() not in rendered or CONTINUE_TAG.strip() not in rendered:
        raise ValueError("final message does not appear in the chat")
    loc = rendered.rindex(CONTINUE_TAG.strip())
    if rendered[loc : loc + len(CONTINUE_TAG)] == CONTINUE_TAG:
        return rendered[:loc]
    return rendered[:loc].rstrip()


def render(env, prep):
    out = env.from_string(prep["template"]).render(**prep["context"])
    if prep["final"] is not None:
        out = cut(out, prep["final"])
    return out


def main():
    contexts = json.loads(subprocess.check_output(["node", "gen.mjs", "--contexts"]))
    env = environment()
    differences = 0
    for model, cases in contexts.items():
        with open(f"../expected/{model}.json", encoding="utf-8") as f:
            expected = json.load(f)
        for name, prep in cases.items():
            try:
                got = {"output": render(env, prep)}
            except Exception as e:  # the template's own error, as vLLM would see it
                got = {"error": str(e)}
            want = expected[name]
            if ("output" in want or "output" in got) and got.get("output") != want.get("output"):
                differences += 1
                print(f"{model}/{name}: jinja2 and @huggingface/jinja differ")
                print(f"  jinja2: {got!r}\n  js:     {want!r}")
    print(f"{differences} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
