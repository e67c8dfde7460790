#!/usr/bin/env python3
"""jinja2_check.py renders every chat vector in ../testdata again with Python's
Jinja2, set up the way transformers' apply_chat_template sets it up (what vLLM
runs), from the vectors' template_input (the request as vLLM reshapes it), and
lists where @huggingface/jinja, the reference the vectors were made with,
renders differently. It changes nothing; it says where the JS reference
and vLLM part.

    apt-get install python3-jinja2     # or any python3 with jinja2
    LLMGW_TOKENIZER_FILES=<repo>/.cache/tokenizers python3 jinja2_check.py [name ...]
"""
import gzip
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.join(HERE, "..", "testdata")


def environment(now):
    # transformers.utils.chat_template_utils._compile_jinja_template
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
    return env


def continue_final(rendered, messages):
    # transformers' continue_final_message cut, as gen.mjs has it.
    final = messages[-1]["content"]
    if isinstance(final, (list, tuple)):
        final = [b for b in final if "text" in b][-1]["text"]
    if final.strip() not in rendered:
        raise ValueError("continue_final_message: the final message does not appear in the rendered chat")
    loc = rendered.rindex(final.strip())
    if rendered[loc : loc + len(final.lstrip())] == final:
        return rendered[: loc + len(final.lstrip())]
    return rendered[: loc + len(final.strip())]


def main():
    import datetime

    files = os.environ.get("LLMGW_TOKENIZER_FILES")
    if not files:
        sys.exit("LLMGW_TOKENIZER_FILES is not set (see ../fetch-tokenizers.sh)")
    names = sys.argv[1:] or sorted(f[: -len(".json.gz")] for f in os.listdir(TESTDATA) if f.endswith(".json.gz"))
    for name in names:
        with gzip.open(os.path.join(TESTDATA, name + ".json.gz")) as f:
            doc = json.load(f)
        if not doc["chats"]:
            print(f"{name}: no chat vectors")
            continue
        with open(os.path.join(files, name, "tokenizer_config.json")) as f:
            config = json.load(f)
        now = datetime.datetime.fromisoformat(doc["now"].replace("Z", "+00:00"))
        template = environment(now).from_string(config["chat_template"])
        differ = 0
        for i, chat in enumerate(doc["chats"]):
            try:
                given = chat["template_input"]
                text = template.render(
                    messages=given["messages"], tools=given["tools"], documents=None,
                    add_generation_prompt=chat["add_generation_prompt"], **{**doc["special"], **chat["kwargs"]})
                if chat["continue_final_message"]:
                    text = continue_final(text, given["messages"])
                error = None
            except Exception as e:  # noqa: BLE001 - a template error is a result here
                text, error = None, str(e)
            if (error is None) == ("error" not in chat) and (error is not None or text == chat["text"]):
                continue
            differ += 1
            want, got = chat.get("text") or "", text or ""
            k = next((j for j in range(min(len(want), len(got))) if want[j] != got[j]), min(len(want), len(got)))
            print(f"  {name} chat {i} ({chat['kind']}): at char {k}")
            print(f"    @huggingface/jinja: {want[max(0, k - 30):k + 50]!r}" + (f" error {chat['error']!r}" if "error" in chat else ""))
            print(f"    Jinja2 {jinja2.__version__}:      {got[max(0, k - 30):k + 50]!r}" + (f" error {error!r}" if error else ""))
        print(f"{name}: {len(doc['chats']) - differ} of {len(doc['chats'])} chats render the same in Jinja2 {jinja2.__version__}")


if __name__ == "__main__":
    main()
