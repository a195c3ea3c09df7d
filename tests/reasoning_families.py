"""Reasoning model families for tests: their published chat templates (tests/data/templates) with a
Hugging Face tokenizer folder that has each family's added tokens (the tiny byte-level BPE under
them), and a scripted "model" that thinks, closes its thinking and answers, whatever it is fed:
what a tiny random model cannot choose to do.

    tok, template = family("qwen3", folder)
    script = Script(tok, "<think>\\nThe capital of France.\\n</think>", "\\n\\nParis.", "</think>")
    script.next(prompt, generated)   # the token it writes next: its thinking until the closer appears
                                     # (its own, the prompt's or a forced one), then its answer and EOS
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tiny import tokenizer_json

from llmcli.formats.tokenizer import from_hf_folder

TEMPLATES = Path(__file__).parent / "data" / "templates"

# name -> (template file, special added tokens, plain added tokens, bos, eos). Qwen3's and the
# DeepSeek-R1 distill's <think> tags are not special (decoding keeps them, as their tokenizer.json
# says); SmolLM3's are made special here so that the parser must see tokens decoding drops, as
# gpt-oss's channel markers are.
FAMILIES = {
    "qwen3": ("qwen3.jinja", ["<|im_start|>", "<|im_end|>"], ["<think>", "</think>", "<tool_call>", "</tool_call>"],
              None, "<|im_end|>"),
    "deepseek-r1": ("deepseek-r1-distill-qwen.jinja",
                    ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
                    ["<think>", "</think>"], "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "smollm3": ("smollm3.jinja", ["<|im_start|>", "<|im_end|>", "<think>", "</think>"], [], None, "<|im_end|>"),
    "gpt-oss": ("gpt-oss.jinja", ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"], [],
                None, "<|return|>"),
}


def template_of(name: str) -> str:
    return (TEMPLATES / FAMILIES[name][0]).read_text()


def family_folder(name: str, folder: Path) -> Path:
    """A tokenizer folder as a Hugging Face repo has it: tokenizer.json, and tokenizer_config.json
    with the family's added tokens, its end token and its chat template."""
    file, special, plain, bos, eos = FAMILIES[name]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tokenizer_json())
    added = {str(1000 + i): {"content": t, "special": t in special} for i, t in enumerate(special + plain)}
    config = {"bos_token": bos, "eos_token": eos, "add_bos_token": False, "added_tokens_decoder": added,
              "chat_template": template_of(name)}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def family(name: str, folder: Path):
    """(tokenizer, template) of the family."""
    return from_hf_folder(family_folder(name, folder), {}), template_of(name)


class Script:
    """A reasoning model's wishes: `thinking` (text, with the opener where the model writes it), then
    once `closer` was written (by it, by a forced close, or at the prompt's end) `answer` and EOS."""

    def __init__(self, tok, thinking: str, answer: str, closer: str):
        self.thinking = tok.encode(thinking, add_bos=False)
        self.answer = tok.encode(answer, add_bos=False) + [min(tok.eos_ids)]
        self.closer = tok.encode(closer, add_bos=False)

    def _closed_at(self, seq: list[int], since: int) -> int | None:
        n = len(self.closer)
        for i in range(len(seq) - n, since - 1, -1):
            if seq[i:i + n] == self.closer:
                return i + n
        return None

    def next(self, prompt: list[int], generated: list[int]) -> int:
        seq = list(prompt) + list(generated)
        at = self._closed_at(seq, max(0, len(prompt) - 6))
        if at is None:
            return self.thinking[min(len(generated), len(self.thinking) - 1)]
        return self.answer[min(len(seq) - at, len(self.answer) - 1)]


class ScriptedTorch(torch.nn.Module):
    """A torch model's face (what generate() and the batch engine call) over a Script: one-hot logits
    on the script's next token. Wrapping a real model keeps its cache bookkeeping (`inner`);
    without one it only counts the cache's length."""

    def __init__(self, script: Script, vocab: int, inner=None):
        super().__init__()
        self.script, self.vocab, self.inner = script, vocab, inner
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        if inner is not None:
            self.args = inner.args
        self.prompt: list[int] = []
        self.generated: list[int] = []

    def forward(self, tokens, cache, *args, last_only=False, hidden=False, **kwargs):
        B, T = tokens.shape
        if self.inner is not None:
            self.inner(tokens, cache, *args, last_only=last_only, hidden=hidden, **kwargs)
        else:
            cache.length += T
        if T > 1 or not self.prompt:  # a prompt (prefilled whole: tests run without a prompt cache)
            self.prompt, self.generated = tokens[0].tolist(), []
        else:
            self.generated += tokens[:, 0].tolist()
        logits = torch.full((B, 1 if last_only else T, self.vocab), -10.0)
        logits[:, -1, self.script.next(self.prompt, self.generated)] = 10.0
        return (logits, torch.zeros(logits.shape[:-1] + (4,))) if hidden else logits


class LeanCache:
    """What the torch-free generator asks of a cache."""

    def __init__(self, max_len: int = 4096):
        self.max_len, self.length, self.token_ids = max_len, 0, []

    def truncate(self, n: int) -> None:
        self.length = n


class ScriptedLean:
    """runtime/lean_step.LeanModel's face over a Script (numpy logits)."""

    def __init__(self, script: Script, vocab: int):
        self.script, self.vocab = script, vocab
        self.prompt: list[int] = []
        self.generated: list[int] = []

    def _out(self, cache, n):
        cache.length += n
        logits = np.full((1, self.vocab), -10.0, dtype=np.float32)
        logits[0, self.script.next(self.prompt, self.generated)] = 10.0
        return logits, np.zeros((1, 4), dtype=np.float32), None

    def prefill(self, ids, cache, top=0):
        self.prompt, self.generated = list(ids), []
        return self._out(cache, len(ids))

    def __call__(self, ids, cache, top=0):
        self.generated += list(ids)
        return self._out(cache, len(ids))

    def rescore(self, logits, h, ids) -> None:  # (its logits are exact)
        pass
