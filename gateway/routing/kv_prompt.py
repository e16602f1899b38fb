"""A prompt's token ids, as the engine will see them, for scoring against the KV index.

The gateway tokenizes with the model's own tokenizer and chat template (transformers; loaded once
per model at start-up, from GATEWAY_KV__TOKENIZERS): a chat request's messages rendered with the
generation prompt, then encoded without special tokens (the template writes them); a completion's
prompt encoded with them; a prompt given as token ids used as is. This is what vLLM's OpenAI
server does for plain text messages. Messages whose content is not a string (images, parts),
tools and chat_template_kwargs are not seen here (the route request carries the messages only):
such a prompt may match fewer blocks than the engine holds, which costs a cache hit, never a
wrong answer. Another engine's chat template (--chat-template) must be given as the directory's.

Cost: a chat session resends its whole conversation every turn, and encoding is the expensive
part (rendering the template is cheap). The tokenizer splits text at its added tokens (the
template's <|im_start|> ...) before anything else, so the text between two of them encodes alike
wherever it sits: those pieces are encoded once and kept (LRU, `_PIECES`), and a turn encodes
only its new messages. A tokenizer whose added tokens strip whitespace around them is encoded
whole every time instead.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson

_PIECES = 4096  # text pieces kept per model (a system prompt, a message): a few MB at most


class PromptTokens:
    """One model's tokenizer. `tokens` is called on the hot path: CPU only, no I/O."""

    def __init__(self, directory: Path) -> None:
        # Imported here: a gateway without kv_aware never loads transformers (seconds, ~100 MB).
        # Any fast tokenizer (a tokenizer.json) and its chat template; the class is the same for
        # every model, so AutoTokenizer's model registry (seconds of imports) is not needed.
        from transformers import PreTrainedTokenizerFast

        self._tok: Any = PreTrainedTokenizerFast.from_pretrained(str(directory))
        # The Rust tokenizer itself: encoding through it skips transformers' Python layers.
        self._fast: Any = self._tok.backend_tokenizer
        added = self._fast.get_added_tokens_decoder()
        plain = all(not (t.lstrip or t.rstrip or t.single_word or t.normalized)
                    for t in added.values())
        self._ids = {t.content: i for i, t in added.items()}
        # Longest first: a token that is a prefix of another must not win.
        self._split = re.compile("(" + "|".join(
            re.escape(c) for c in sorted(self._ids, key=len, reverse=True)) + ")") \
            if plain and self._ids else None
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()

    def tokens(self, prefix: bytes) -> list[int] | None:
        """`prefix` as RouteRequest carries it (gateway/api/replicas.py): a chat request's
        messages as JSON, or a completion's prompt (text, or JSON of token ids). None: not
        something to tokenize here (the caller routes without the index)."""
        if prefix[:1] == b"[":
            try:
                value = orjson.loads(prefix)
            except orjson.JSONDecodeError:
                value = None
            if isinstance(value, list) and value:
                if all(isinstance(m, dict) for m in value):
                    return self._chat(value)
                if all(isinstance(t, int) for t in value):
                    return value
                return None  # a batch of prompts: several prompts, several replicas' worth
        try:
            text = prefix.decode()
        except UnicodeDecodeError:
            return None
        return list(self._fast.encode(text, add_special_tokens=True).ids)

    def _chat(self, messages: list[dict[str, Any]]) -> list[int] | None:
        for m in messages:
            if not isinstance(m.get("content"), str):
                return None
        text = self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(text, str):
            return None
        if self._split is None:
            return list(self._fast.encode(text, add_special_tokens=False).ids)
        out: list[int] = []
        pieces = self._pieces
        ids = self._ids
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:  # an added token (the split's captured group)
                out.append(ids[piece])
            elif piece:
                got = pieces.get(piece)
                if got is None:
                    got = pieces[piece] = self._fast.encode(piece, add_special_tokens=False).ids
                    if len(pieces) > _PIECES:
                        pieces.popitem(last=False)
                else:
                    pieces.move_to_end(piece)
                out += got
        return out
