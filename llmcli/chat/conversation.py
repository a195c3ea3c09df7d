"""A chat conversation as plain data: the system prompt, the messages, the parameters.

It is saved and loaded as one JSON file (written atomically), and it knows how to fit itself into
a context window: the oldest turns are dropped first, the system prompt always stays, and a single
message that cannot fit is refused. Nothing here touches a terminal or a model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ..decode.sampling_plain import SamplingParams, parse_parameter
from ..errors import InvalidParameterError, LlmcliError, PromptTooLongError
from ..hub.store import atomic_write_text
from ..json_input import JsonInputError, load_json
from ..text_input import check_text, read_text_file

FORMAT = "llmcli-conversation"
VERSION = 1
DEFAULT_REPLY_ROOM = 512  # tokens kept free for the reply when fitting (at most half the context)


class ConversationFileError(LlmcliError):
    """A conversation file that is missing, unreadable or not a conversation."""


@dataclass
class Conversation:
    system: str | None = None
    # {"role": "user" | "assistant" | "tool", "content": str}; a reply cut short by Ctrl-C has "interrupted":
    # True; with tools, an assistant message may have "tool_calls" and a tool message its "tool_call_id"
    messages: list[dict] = field(default_factory=list)
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    model: dict = field(default_factory=dict)  # name, architecture, weights of the model that wrote it
    start: int = 0  # messages before this index no longer fit the context: kept for /save, not sent

    def window(self) -> list[dict]:
        """What the model sees: the system prompt, then the messages still in the context."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        keep = ("role", "content", "tool_calls", "tool_call_id")
        return head + [{k: m[k] for k in keep if k in m} for m in self.messages[self.start:]]

    def clear(self) -> None:
        self.messages, self.start = [], 0

    @property
    def last_reply(self) -> dict | None:
        return self.messages[-1] if self.messages and self.messages[-1]["role"] == "assistant" else None

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION,
                "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "model": self.model, "system": self.system,
                "parameters": {**asdict(self.params), "max_tokens": self.max_tokens, "stop": list(self.stop)},
                "messages": self.messages}

    @classmethod
    def from_dict(cls, data: dict, where: str = "the conversation") -> "Conversation":
        bad = f"{where} is not an llmcli conversation"
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConversationFileError(f"{bad} (no \"format\": \"{FORMAT}\"); pass a file written by /save")
        if data.get("version") != VERSION:
            raise ConversationFileError(f"{where} has format version {data.get('version')!r}; this llmcli reads {VERSION}")
        messages = data.get("messages")
        if not isinstance(messages, list) or not all(_valid_message(m) for m in messages):
            raise ConversationFileError(f"{bad}: \"messages\" must be a list of "
                                        "{\"role\": \"user\"|\"assistant\", \"content\": text}")
        system = data.get("system")
        if system is not None and not _is_text(system):
            raise ConversationFileError(f"{bad}: \"system\" must be text or null")
        raw = data.get("parameters") or {}
        if not isinstance(raw, dict):
            raise ConversationFileError(f"{bad}: \"parameters\" must be an object")
        params, max_tokens, stop = SamplingParams(), None, ()
        try:
            for name, value in raw.items():
                if name == "max_tokens":
                    max_tokens = check_max_tokens(value)
                elif name == "stop":
                    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                        raise InvalidParameterError("stop must be a list of texts")
                    stop = tuple(value)
                else:
                    params = parse_parameter(params, name, str(value))
        except InvalidParameterError as e:
            raise ConversationFileError(f"{where} has a bad parameter: {e}") from None
        model = data.get("model") if isinstance(data.get("model"), dict) else {}
        return cls(system or None, [dict(m) for m in messages], params, max_tokens, stop, model)


def _valid_message(m) -> bool:
    return (isinstance(m, dict) and m.get("role") in ("user", "assistant", "tool") and _is_text(m.get("content"))
            and isinstance(m.get("interrupted", False), bool) and isinstance(m.get("tool_calls", []), list)
            and isinstance(m.get("tool_call_id", ""), str))


def _is_text(value) -> bool:
    """A str that is UTF-8 text (JSON's \\udcxx escapes can carry lone surrogates, which tokenizers refuse)."""
    if not isinstance(value, str):
        return False
    try:
        check_text(value, "text")
    except InvalidParameterError:
        return False
    return True


def check_max_tokens(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameterError(f"max-tokens must be a whole number of at least 1, got {value!r}")
    return value


# ------------------------------------------------------------------------------------ files

def save(conv: Conversation, path: str | Path) -> Path:
    """Write the whole conversation (dropped turns included) as JSON, atomically."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ConversationFileError(f"{path} is a folder; give a file name, e.g. {path / 'chat.json'}")
    if not path.parent.is_dir():
        raise ConversationFileError(f"cannot save to {path}: the folder {path.parent} does not exist; create it first")
    text = json.dumps(conv.to_dict(), ensure_ascii=False, indent=2) + "\n"
    try:
        atomic_write_text(path, text)
    except OSError as e:
        raise ConversationFileError(f"cannot save to {path}: {e.strerror or e}") from None
    return path


def load(path: str | Path) -> Conversation:
    """A conversation written by save(): a regular file of bounded JSON (json_input's limits)."""
    hint = "pass a file written by /save"
    try:
        data = load_json(read_text_file(path, hint=hint), str(Path(path).expanduser()))
    except JsonInputError as e:
        raise ConversationFileError(f"{e}; {hint}") from None
    except InvalidParameterError as e:
        raise ConversationFileError(str(e)) from None
    return Conversation.from_dict(data, str(path))


# ---------------------------------------------------------------------------------- context

@dataclass
class Fit:
    ids: list[int]  # the prompt for the next reply
    dropped: list[dict]  # messages that left the context to make room (oldest first)


def reply_room(ctx_size: int, max_tokens: int | None) -> int:
    """Tokens to keep free for the reply when deciding what still fits."""
    return max(1, min(max_tokens or DEFAULT_REPLY_ROOM, ctx_size // 2))


def fit(conv: Conversation, encode: Callable[[list[dict]], list[int]], ctx_size: int) -> Fit:
    """Drop the oldest turns until the prompt leaves room for a reply; never drop the system prompt
    or the newest user message. A message that cannot fit even alone raises PromptTooLongError.

    When turns must go, a quarter of the context more is freed than strictly needed, so that the
    next few turns extend the cache instead of re-reading the whole conversation each time."""
    room = reply_room(ctx_size, conv.max_tokens)
    limit = ctx_size - room
    ids = encode(conv.window())
    if len(ids) <= limit:
        return Fit(ids, [])
    users = [i for i, m in enumerate(conv.messages) if m["role"] == "user"]
    last_user = users[-1] if users else len(conv.messages)
    first = conv.start
    conv.start = last_user
    alone = encode(conv.window())
    conv.start = first
    if len(alone) > limit:
        what = "with the system prompt " if conv.system else ""
        raise PromptTooLongError(
            f"this message is {len(alone)} tokens {what}but the context holds {ctx_size} "
            f"and {room} are kept for the reply; shorten it or restart with a larger --ctx-size")
    target = max(limit - ctx_size // 4, 0)
    start = conv.start
    while start < last_user:
        # the next turn begins at the next user message
        start = next(i for i in range(start + 1, last_user + 1) if conv.messages[i]["role"] == "user")
        conv.start = start
        ids = encode(conv.window())
        if len(ids) <= target:
            break
    return Fit(ids, conv.messages[first:conv.start])
