"""Chat templates: the tool-use check every served model must pass, and the templates clawgym ships.

A harness offers tools and sends back tool calls and tool results; a chat template that drops any
of them makes every tool task unsolvable while everything still seems to work. `tool_use_problems`
renders a short tool-using conversation and names what went missing. The proxy refuses to start
on a template with problems (`check_tool_template`), and `clawgym inspect` shows them.

`assistant_completion` is the other direction: the text a model served under a template would
generate for a given assistant message (its text and tool calls, in the template's own call form).
The teacher engine answers with it, so teacher trajectories teach the student its own template.

`--chat-template` (serve-proxy, rollout, eval; `[engine] chat_template` in a recipe) replaces a
model's template: either a Jinja file or the name of a template shipped in `data/templates/`:

    chatml-tools    ChatML with Qwen3/Hermes tool conventions (the tiny init-model policy's own)
    smollm2-tools   SmolLM2-Instruct's ChatML with its default system prompt, plus tools in its
                    native `<tool_call>[...]</tool_call>` JSON-list form

See docs/engines.md ("Chat templates").
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from clawgym.errors import UserError

SHIPPED = {
    "chatml-tools": "ChatML with Qwen3/Hermes tool calls (<tool_call>{...}</tool_call>) for any ChatML model",
    "smollm2-tools": "SmolLM2-Instruct: its default system prompt, tool calls as <tool_call>[...]</tool_call>",
}

# Distinct strings, so each one shows which part of the conversation the template rendered.
_TOOL_DESCRIPTION = "Runs a shell command (clawgym template probe)"
_CALL_ARGUMENT = "echo clawgym-probe-call"
_TOOL_RESULT = "clawgym-probe-result"
_FINAL = "clawgym-probe-done"


def shipped_template(name: str) -> str:
    """The text of a template clawgym ships (`SHIPPED`)."""
    if name not in SHIPPED:
        raise UserError(f"unknown chat template '{name}'; shipped: {', '.join(SHIPPED)} (or give a .jinja file)")
    return resources.files("clawgym").joinpath(f"data/templates/{name}.jinja").read_text(encoding="utf-8")


def load_chat_template(value: str | Path, where: str = "--chat-template") -> str:
    """`--chat-template` / `[engine] chat_template`: a Jinja file's text, or a shipped template by name."""
    path = Path(value)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{where} {value}: cannot read it ({e})") from None
        if not text.strip():
            raise UserError(f"{where} {value}: the file is empty")
        return text
    if str(value) in SHIPPED:
        return shipped_template(str(value))
    raise UserError(f"{where} {value}: no such file, and not a shipped template ({', '.join(SHIPPED)})")


def tool_use_problems(tokenizer) -> list[str]:
    """What a tokenizer's chat template loses of a tool-using conversation; empty when nothing."""
    if not getattr(tokenizer, "chat_template", None):
        return ["the tokenizer has no chat template"]
    tools = [{"type": "function", "function": {"name": "bash", "description": _TOOL_DESCRIPTION,
                                               "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Write hi to out.txt"},
        # Ids of 9 letters and digits: the form Mistral's templates insist on; any other accepts it.
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "call00001", "function": {"name": "bash", "arguments": {"command": _CALL_ARGUMENT}}}]},
        {"role": "tool", "tool_call_id": "call00001", "content": _TOOL_RESULT},
        {"role": "assistant", "content": _FINAL},
    ]
    try:
        with_tools = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        without = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as e:  # a template raising on tool roles is the finding itself
        return [f"rendering a tool-using conversation fails ({type(e).__name__}: {e})"]
    problems = []
    if _TOOL_DESCRIPTION not in with_tools:
        problems.append("the tools offered are not rendered")
    if _CALL_ARGUMENT not in without:
        problems.append("an assistant turn's tool calls are not rendered")
    if _TOOL_RESULT not in without:
        problems.append("tool results are not rendered")
    if _FINAL not in without:
        problems.append("the conversation after a tool result is not rendered")
    return problems


def check_tool_template(tokenizer, where: str) -> None:
    """Refuse a template that drops tools, tool calls or tool results (one line naming the fix)."""
    problems = tool_use_problems(tokenizer)
    if problems:
        raise UserError(f"{where}: the chat template cannot serve agents: {'; '.join(problems)}. Give a tool-capable "
                        f"template with --chat-template FILE (or [engine] chat_template in a recipe); clawgym ships "
                        f"{', '.join(SHIPPED)} (docs/engines.md, 'Chat templates')")


# The markers that end an assistant turn in the templates clawgym serves (the proxy's stop ids, besides eos).
_END_MARKERS = ("<|im_end|>", "<|endoftext|>")


def assistant_completion(tokenizer, content: str, tool_calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The text a model served with `tokenizer`'s chat template generates for one assistant message.

    It is the template's rendering of the message after the generation prompt, through the marker
    that ends the turn (the engine's stop id). ValueError when the template shows no such turn."""
    context = [{"role": "user", "content": "clawgym-probe-question"}]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:  # ids of 9 letters and digits, as in tool_use_problems
        message["tool_calls"] = [{"type": "function", "id": f"call{i:05d}", "function": {"name": name, "arguments": args}}
                                 for i, (name, args) in enumerate(tool_calls)]
    prompt = tokenizer.apply_chat_template(context, tokenize=False, add_generation_prompt=True)
    bare = tokenizer.apply_chat_template(context, tokenize=False)
    history = tokenizer.apply_chat_template([*context, message], tokenize=False)
    gen = prompt[len(bare):] if prompt.startswith(bare) else ""
    # History may show a bare header where the prompt says more (Qwen3's empty think block without
    # thinking); the model then generates what follows that longer prompt, the turn's content.
    header = gen[: gen.index("\n") + 1] if "\n" in gen else gen
    if gen and history.startswith(prompt):
        body = history[len(prompt):]
    elif header and history.startswith(bare + header):
        body = history[len(bare) + len(header):]
    else:
        raise ValueError("the chat template renders no assistant turn after its generation prompt")
    ends = []
    for marker in {tokenizer.eos_token, *_END_MARKERS}:
        if marker and (at := body.find(marker)) >= 0:
            ends.append(at + len(marker))
    if not ends:
        raise ValueError("the chat template's assistant turn has no end-of-turn marker")
    return body[: min(ends)]
