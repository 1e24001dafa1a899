"""Rendering with the model's own chat template, incremental per rollout, with token-in-token-out splicing.

The proxy never re-tokenizes what the policy sampled. Per rollout, `RolloutTito` keeps

- every completion it returned, with its sampled ids, indexed by the assistant message *as the
  harness will echo it* in a canonical form (text with all whitespace removed; tool calls as name +
  JSON arguments with sorted keys; ids and thinking ignored, since harnesses rewrite or drop them),
  and tagged with where in the conversation it was sampled (see "Which completion" below);
- a node per rendered request, keyed by a hash chain over the request's canonical messages (plus
  the tools), holding that prompt's token ids (nodes share one growing id list per conversation).

Which completion: the canonical form alone does not identify a turn, since a model can make the
same tool call twice (differing only in JSON spacing or in its dropped reasoning). Among the
completions whose canonical form matches an echoed assistant message, the renderer prefers, in
order: the one sampled for exactly the messages before it (an append-only harness); the one whose
prompt held the same assistant turns before it (a harness that drops or rewrites other messages,
like OpenClaw's per-turn context message); the one from the same conversation (same tools and
first message); the same text around the calls; and, in a tie, the earliest one sampled after the
previous spliced turn. A completion is spliced at most once per request. See docs/architecture.md.

Rendering a request:
1. every assistant message that matches a stored completion is replaced by a sentinel before the
   template runs, so the template renders everything around it exactly as usual;
2. the text is cut at the sentinels: each assistant body (from the template's assistant header
   to its end-of-turn marker) becomes the completion's sampled ids preceded by the generation
   prompt the model was actually shown (Qwen3 with thinking off adds an empty think block there
   that rendered history drops), and each stretch of text between bodies is tokenized on its own,
   so BPE never merges across a boundary that sampled ids fix (exact-history mode);
3. incremental path: find the longest earlier request this one extends (a node); render only a
   window — the system message, the node's last message, and the new messages — and take the
   part after the window's own rendering of its context. If the window's rendering of the context
   is not a prefix of its full rendering (a template that is not prefix-stable), or no node
   matches (first call, history rewritten by compaction), render the whole request (counted).

A later prompt therefore extends an earlier prompt plus its sampled output token for token
whenever the harness appended to the conversation, and keeps every turn's own sampled ids when it
dropped or moved other messages. `audit=True` also renders fully and compares.

Each plan also says how its record stores the prompt (`delta`): the prompt delta codec's rule
(artifacts/codec.py), given the call whose request this one extends (a node: found by messages, no
token scan) and the rollout's latest call.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from clawgym.artifacts import PromptBase, PromptDelta, common_prefix, encode_prompt
from clawgym.proxy.types import Message, ToolCall, ToolSpec

_SENT = re.compile("\ue000(\\d+)\ue001")
_WS = re.compile(r"\s+")


def _nows(s: str) -> str:
    return _WS.sub("", s)


def _canon_args(a: Any) -> Any:
    if isinstance(a, str):
        try:
            a = orjson.loads(a)
        except orjson.JSONDecodeError:
            return _nows(a)
    return orjson.dumps(a, option=orjson.OPT_SORT_KEYS).decode() if isinstance(a, (dict, list)) else _nows(str(a))


def assistant_key(text: str, calls: list[ToolCall]) -> bytes:
    """Canonical form of an assistant turn: what survives any harness's re-serialization."""
    return orjson.dumps(["assistant", _nows(text), [[c.qualified_name, _canon_args(c.arguments)] for c in calls]])


def message_key(m: Message) -> bytes:
    if m.role == "assistant":
        return assistant_key(m.content, m.tool_calls)
    return orjson.dumps([m.role, m.content])  # exact text: the prompt must show what the harness sent


def turn_identity(text: str, calls: list[ToolCall]) -> bytes:
    """What an echoed assistant turn is matched on: its tool calls alone when it has any (harnesses
    drop or rewrite the text around them), else its text."""
    return assistant_key("\0", calls) if calls else assistant_key(text, calls)


def _h(*parts: bytes) -> bytes:
    return hashlib.blake2b(b"".join(parts), digest_size=16).digest()


@dataclass(frozen=True)
class _Where:
    """Where in a conversation a completion was sampled (all hashes over canonical messages)."""

    prompt: bytes = b""
    """the whole prompt: the tools and every message"""
    root: bytes = b""
    """the tools and the first message: which conversation"""
    turns: bytes = b""
    """the assistant turns of the prompt, in order, by `turn_identity`"""


@dataclass
class Completion:
    call_id: str
    output_ids: list[int]
    ends_turn: bool
    """the last sampled id is an end-of-turn id (else the template's end-of-turn is tokenized after it)"""
    key: bytes = b""
    """`assistant_key` of the turn as parsed"""
    seq: int = 0
    """order of sampling within the rollout"""
    where: _Where = field(default_factory=_Where)


@dataclass
class _Node:
    chain: list[int]
    length: int
    call_id: str


def _prompt(node: _Node) -> list[int]:
    """A node's prompt ids. The newest node of a conversation owns its whole id list: no copy of it
    (the caller reads it before any commit extends the list)."""
    return node.chain if node.length == len(node.chain) else node.chain[: node.length]


@dataclass
class RenderPlan:
    """A rendered prompt, not yet attached to the rollout (the proxy may still refuse the call)."""

    prompt_ids: list[int]
    mode: str
    """incremental | full"""
    spliced: int
    """assistant turns whose sampled ids were spliced in"""
    unmatched: int
    """assistant turns rendered from their text (no stored completion matched)"""
    fallback: bool
    """a full render although the rollout already had conversations (history rewritten, or no prefix-stable window)"""
    audit_mismatch: bool = False
    delta: PromptDelta = field(default_factory=PromptDelta)
    """how the record stores the prompt: the codec's choice among this rollout's calls (artifacts/codec.py)"""
    _hashes: list[bytes] = field(default_factory=list, repr=False)
    _node: _Node | None = field(default=None, repr=False)
    _where: _Where = field(default_factory=_Where, repr=False)

    @property
    def base_call(self) -> str | None:
        return self.delta.base_call

    @property
    def base_len(self) -> int:
        return self.delta.base_len


class Renderer:
    """The model's chat template + tokenizer, with the few strings TITO needs found once."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self._encode = tokenizer.backend_tokenizer.encode
        self.eos_text = tokenizer.eos_token
        stops = {tokenizer.eos_token_id}
        for extra in ("<|endoftext|>", "<|im_end|>"):
            tid = tokenizer.convert_tokens_to_ids(extra)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
                stops.add(tid)
        self.stop_ids = tuple(sorted(s for s in stops if s is not None))
        probe = [{"role": "user", "content": "x"}]
        with_gen, without = self.text(probe, [], True), self.text(probe, [], False)
        self.gen_prompt = with_gen[len(without):] if with_gen.startswith(without) else ""
        # The header the template writes before every assistant turn in history. The generation
        # prompt may say more (Qwen3 without thinking adds an empty <think></think> block that the
        # history never shows); before a spliced turn the prompt gets what the model was shown.
        g = self.gen_prompt
        self.header = g[: g.index("\n") + 1] if "\n" in g else g

    def text(self, messages: list[dict], tools: list[dict], gen: bool) -> str:
        return self.tok.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=gen)

    def encode(self, text: str) -> list[int]:
        return self._encode(text, add_special_tokens=False).ids if text else []

    def split(self, text: str, comps: dict[int, Completion], start: int = 0) -> tuple[list[int], list[tuple[str, Any]]]:
        """Token ids of `text[start:]`: env text tokenized per stretch, sentinels replaced by sampled ids."""
        ids: list[int] = []
        segs: list[tuple[str, Any]] = []
        pos, g, hdr = start, self.gen_prompt, self.header
        for m in _SENT.finditer(text, start):
            comp = comps[int(m.group(1))]
            hs = text.rfind(hdr, max(0, pos - len(hdr)), m.start()) if hdr else -1
            if hs < 0:  # a template without a recognizable header: splice right at the content
                env = text[pos:m.start()]
            elif hs < pos:  # the header closes the part already emitted (the incremental tail's start)
                env = ""
            else:  # the template's rendering of the turn's start -> the generation prompt the model saw
                env = text[pos:hs] + g
            ids += self.encode(env)
            ids += comp.output_ids
            segs += [("env", env), ("model", comp)]
            e = text.find(self.eos_text, m.end())
            pos = m.end() if e < 0 else (e + len(self.eos_text) if comp.ends_turn else e)
        env = text[pos:]
        ids += self.encode(env)
        segs.append(("env", env))
        return ids, segs


class RolloutTito:
    """One rollout's completions and rendered conversations; see the module docstring."""

    def __init__(self, renderer: Renderer, audit: bool = False):
        self.r = renderer
        self.audit = audit
        self.completions: dict[bytes, list[Completion]] = {}
        """by `turn_identity`, in sampling order"""
        self.by_call: dict[str, Completion] = {}
        self.nodes: dict[bytes, _Node] = {}
        self.last: tuple[_Node, str] | None = None
        self._pending: dict[str, _Where] = {}

    # -- rendering -----------------------------------------------------------------------------

    def _prep(self, messages: list[Message], tools_d: list[dict]) -> tuple[list[dict], dict[int, Completion], list[bytes], _Where]:
        """Template dicts, with each assistant turn we generated replaced by a placeholder; also the
        request's hash chain (`hashes[i]` covers the tools and messages[:i+1]) and its `_Where`."""
        h = _h(orjson.dumps(tools_d, option=orjson.OPT_SORT_KEYS))
        dicts, comps, hashes, used = [], {}, [], set()
        root = turns = b""
        prev_seq = -1
        for i, m in enumerate(messages):
            key = message_key(m)
            comp = None
            if m.role == "assistant":
                ident = turn_identity(m.content, m.tool_calls)
                here = _Where(h, root, turns)  # h still covers only messages[:i]
                comp = self._pick(self.completions.get(ident, ()), key, here, prev_seq, used)
                turns = _h(turns, ident)
            h = _h(h, key)
            hashes.append(h)
            root = root or h
            if comp is None:
                dicts.append(m.template_dict())
            else:
                comps[i] = comp
                used.add(comp.call_id)
                prev_seq = comp.seq
                dicts.append({"role": "assistant", "content": f"\ue000{i}\ue001"})
        return dicts, comps, hashes, _Where(h if hashes else b"", root, turns)

    @staticmethod
    def _pick(cands, key: bytes, here: _Where, prev_seq: int, used: set[str]) -> Completion | None:
        """The completion an echoed assistant turn stands for; the order of preference is in the module docstring."""
        best, best_score = None, None
        for c in cands:
            if c.call_id in used:  # one sampled turn appears once in a conversation
                continue
            w = c.where
            score = (w.prompt == here.prompt, w.turns == here.turns, w.root == here.root, c.key == key,
                     c.seq > prev_seq, -c.seq if c.seq > prev_seq else c.seq)
            if best_score is None or score > best_score:
                best, best_score = c, score
        return best

    def render(self, messages: list[Message], tools: list[ToolSpec]) -> RenderPlan:
        tools_d = [t.template_dict() for t in tools]
        dicts, comps, hashes, where = self._prep(messages, tools_d)
        n_assist = sum(1 for m in messages if m.role == "assistant")
        k, node = next(((k, self.nodes[hashes[k - 1]]) for k in range(len(messages), 0, -1) if hashes[k - 1] in self.nodes),
                       (0, None))
        plan = None
        if node is not None and k == len(messages):  # an identical request (a retry): same prompt
            plan = RenderPlan(node.chain[: node.length], "incremental", 0, 0, False)
        elif node is not None:
            plan = self._incremental(messages, dicts, comps, tools_d, k, node)
        # A full render once the rollout has a conversation means the harness rewrote history
        # (compaction, a stripped turn) or the template was not prefix-stable over the window.
        fallback = plan is None and bool(self.nodes)
        audit_mismatch, ids = False, None
        if plan is not None and self.audit and (ids := self._full(dicts, comps, tools_d)) != plan.prompt_ids:
            plan, fallback, audit_mismatch = None, True, True
        if plan is None:
            ids = ids if ids is not None else self._full(dicts, comps, tools_d)
            plan = RenderPlan(ids, "full", len(comps), n_assist - len(comps), fallback)
        plan.audit_mismatch = audit_mismatch
        plan.delta = encode_prompt(plan.prompt_ids, self._bases(plan.prompt_ids, node, incremental=plan.mode == "incremental"))
        plan._hashes, plan._node, plan._where = hashes, node if plan.mode == "incremental" else None, where
        return plan

    def count(self, messages: list[Message], tools: list[ToolSpec]) -> int:
        """Prompt length of a request, rendered fully; the rollout's state is left untouched."""
        tools_d = [t.template_dict() for t in tools]
        dicts, comps, _, _ = self._prep(messages, tools_d)
        return len(self._full(dicts, comps, tools_d))

    def _full(self, dicts: list[dict], comps: dict[int, Completion], tools_d: list[dict]) -> list[int]:
        return self.r.split(self.r.text(dicts, tools_d, True), comps)[0]

    def _incremental(self, messages, dicts, comps, tools_d, k: int, node: _Node) -> RenderPlan | None:
        ctx = ([0] if messages[0].role == "system" and k - 1 > 0 else []) + [k - 1]
        window = [dicts[i] for i in ctx]
        head = self.r.text(window, tools_d, True)
        text = self.r.text(window + dicts[k:], tools_d, True)
        g, hdr = self.r.gen_prompt, self.r.header
        if text.startswith(head):
            start = len(head)
        elif k in comps and g and head.endswith(g) and text.startswith(head[: len(head) - len(g)] + hdr):
            start = len(head) - len(g) + len(hdr)  # history shows a bare header where the prompt had more
        else:
            return None
        win_comps = {i: comps[i] for i in comps if i >= k}
        tail, _ = self.r.split(text, win_comps, start=start)
        prompt = node.chain[: node.length] + tail
        n_assist = sum(1 for m in messages[k:] if m.role == "assistant")
        return RenderPlan(prompt, "incremental", len(win_comps), n_assist - len(win_comps), False)

    def _bases(self, ids: list[int], node: _Node | None, incremental: bool) -> tuple[PromptBase | None, PromptBase | None]:
        """The delta codec's candidates: the call whose conversation this prompt extends, and the
        rollout's latest call. The first is the node of the longest earlier request this one
        continues, when its whole prompt starts this one: always for an incremental render (the
        prompt is built on it), checked for a full one (a rewritten history may keep the messages
        but not the tokens)."""
        extended = None
        if node is not None and (incremental or common_prefix(_prompt(node), ids) == node.length):
            extended = self._base(node, shared=node.length)
        latest = None
        if self.last is not None and (extended is None or self.last[1] != extended.call_id):
            latest = self._base(self.last[0], shared=0)
        return extended, latest

    def _base(self, node: _Node, shared: int) -> PromptBase:
        comp = self.by_call.get(node.call_id)  # None while that call is still generating
        return PromptBase(node.call_id, _prompt(node), comp.output_ids if comp else (), shared)

    # -- state updates -------------------------------------------------------------------------

    def commit(self, plan: RenderPlan, call_id: str) -> None:
        """Attach an accepted call's prompt to the rollout, so later requests can extend it."""
        if not plan._hashes:
            return
        self._pending[call_id] = plan._where  # for add_completion: where this call's answer was sampled
        node = plan._node
        prompt = plan.prompt_ids
        if node is not None and node.length == len(node.chain):
            node.chain.extend(prompt[node.length:])  # extend the conversation's id list in place
            new = _Node(node.chain, len(node.chain), call_id)
        else:
            new = _Node(list(prompt), len(prompt), call_id)
        self.nodes[plan._hashes[-1]] = new
        self.last = (new, call_id)

    def add_completion(self, call_id: str, text: str, calls: list[ToolCall], output_ids: list[int]) -> None:
        """Remember what the model sampled, indexed by how the harness will echo the turn."""
        comp = Completion(call_id, list(output_ids), bool(output_ids) and output_ids[-1] in self.r.stop_ids,
                          assistant_key(text, calls), len(self.by_call), self._pending.pop(call_id, _Where()))
        self.completions.setdefault(turn_identity(text, calls), []).append(comp)
        self.by_call[call_id] = comp
