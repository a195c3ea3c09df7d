"""Constrained decoding: output that follows a JSON schema, a regex or a grammar (GBNF or Lark).

Three steps, each an object:

    Grammar            what the user gave (--json-schema FILE, --regex PATTERN, --grammar FILE), read and
                       checked before any model loads; it also checks the finished text
    GrammarCompiler    binds grammars to one model's tokenizer (llguidance's token trie, built once per
                       model: the slow part)
    TokenConstraint    one per generated sequence (a batch holds one per row); generate.py's decode loop
                       calls, per token:

        logits = constraint.mask(logits)   # tokens the grammar forbids -> -inf
        constraint.advance(token)          # the sampled token moves the matcher on
        constraint.is_done()               # only an end token may follow: stop without another step

The engine is llguidance (guidance-ai): an Earley parser over a lexer, with token masks computed
from a trie of the vocabulary in Rust. A mask takes a small fraction of a decode step
(docs/performance-choices.md), so it runs inline rather than overlapped with the forward pass.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import GrammarError, InvalidOutputError, InvalidParameterError, UnsupportedModelError
from ..formats.tokenizer import Tokenizer
from ..json_input import load_json
from ..text_input import read_text_file
from .regex_check import MAX_REPETITIONS, ascii_digits, repetitions

KINDS = {"json_schema": "--json-schema", "regex": "--regex", "grammar": "--grammar"}
# JSON comes out on one line, spaced as Python's json.dumps: with llguidance's default (any whitespace
# between tokens) a sampled SmolLM2 wrote `{\n  "name"  \n:  \n"Mara"...` and could pad until -n ran
# out. A schema's own "x-guidance" options take precedence.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Grammar:
    kind: str  # "json_schema" | "regex" | "grammar" (Lark, or GBNF read as Lark) | "tools" (tool_grammar.py)
    source: str  # the schema's JSON text, the pattern, or the Lark text
    compiled: str  # llguidance's grammar (JSON text) built from `source`
    schema: dict | bool | None = None  # the parsed schema, for validating the output
    whole_reply: bool = False  # it covers a reasoning model's thinking too (harmony's calls, harmony_grammar.py)

    @property
    def what(self) -> str:
        """The thing the output must be, for messages: 'the JSON', 'the regex match', ..."""
        return {"json_schema": "the JSON", "regex": "the text matching --regex", "grammar": "the text of the grammar",
                "tools": "the tool call"}[self.kind]

    def check_output(self, text: str) -> None:
        """Raise InvalidOutputError unless `text` parses and validates (JSON Schema) or fully matches
        (regex). The matcher guarantees both; this is the independent check that it did."""
        if self.kind == "json_schema":
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                raise InvalidOutputError(f"the output is not valid JSON ({e}); this is a bug, please report it") from None
            import jsonschema

            error = jsonschema.exceptions.best_match(_validator(self.schema).iter_errors(value))
            if error is not None:
                raise InvalidOutputError(f"the output does not validate against the schema ({error.message}); "
                                         "this is a bug, please report it")
        elif self.kind == "regex":
            pattern = _python_regex(ascii_digits(self.source, python=True))
            if pattern is not None and pattern.fullmatch(text) is None:
                raise InvalidOutputError(f"the output {text!r} does not match the regex; this is a bug, please report it")


def from_flags(json_schema: Path | None = None, regex: str | None = None, grammar: Path | None = None) -> Grammar | None:
    """The one grammar the flags ask for (None: unconstrained); every mistake is a GrammarError."""
    given = [(k, v) for k, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar)) if v is not None]
    if len(given) > 1:
        raise InvalidParameterError(f"{' and '.join(KINDS[k] for k, _ in given)} exclude each other; pass one")
    if not given:
        return None
    kind, value = given[0]
    if kind == "regex":
        return from_regex(value)
    text = _read(value, KINDS[kind])
    return from_json_schema(text, str(value)) if kind == "json_schema" else from_grammar(text, str(value))


def from_json_schema(text: str, name: str = "the schema") -> Grammar:
    """A JSON Schema (text): valid JSON, a valid schema by its own draft, and only keywords llguidance
    implements (an unimplemented one is refused, never silently ignored)."""
    import jsonschema
    import llguidance

    try:
        schema = load_json(text, name)  # bounded: a schema nested 10,000 deep is refused here
    except InvalidParameterError as e:
        raise GrammarError(str(e)) from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"{name} is not a JSON Schema: it must be an object (or true/false), got {type(schema).__name__}")
    try:
        _validator(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        where = "/".join(str(p) for p in e.path)
        raise GrammarError(f"{name} is not a valid JSON Schema: {_one_line(e.message)}"
                           + (f" (at {where})" if where else "")) from None
    compiled = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    _check(compiled, f"{name} cannot be used for constrained output")
    _probe(compiled, f"{name} cannot be used for constrained output", "it describes no JSON value that can be "
           "written (does a $ref point back to itself?)")
    return Grammar("json_schema", text, compiled, schema)


def from_regex(pattern: str) -> Grammar:
    """A regular expression (Rust `regex` syntax, no look-around) the whole output must match."""
    import llguidance

    if not pattern:
        raise GrammarError("--regex is empty; pass a pattern, e.g. --regex '[0-9]+'")
    copies = repetitions(pattern)
    if copies > MAX_REPETITIONS:  # llguidance accepts it, then fails mid-generation
        raise GrammarError(f"--regex {pattern!r} repeats too much: its counted repetitions ask for {copies} copies "
                           f"of what they repeat, and the constraint engine builds at most {MAX_REPETITIONS}; "
                           "use * or + for long runs")
    compiled = llguidance.LLMatcher.grammar_from_regex(ascii_digits(pattern))  # \d is 0-9, not all of Nd
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled)
    if is_error:  # the position llguidance gives is in the grammar it wraps the pattern in: drop it
        why = re.sub(r"^at \d+\(\d+\): |invalid regex .*\(in regex\): ", "", _one_line(messages[0]))
        raise GrammarError(f"--regex {pattern!r} is not a usable regex: {why}")
    _probe(compiled, f"--regex {pattern!r} is not a usable regex", "it matches no text")
    return Grammar("regex", pattern, compiled)


# a GBNF rule definition (llama.cpp's grammars: `root ::= ...`); Lark writes `name:`
_GBNF_RULE = re.compile(r"^[ \t]*[a-zA-Z0-9_-]+[ \t]*::=", re.MULTILINE)


def is_gbnf(text: str) -> bool:
    return _GBNF_RULE.search(text) is not None


def from_grammar(text: str, name: str = "the grammar") -> Grammar:
    """A grammar as llama.cpp users write them (GBNF: `root ::= ...`), or a Lark grammar (from_lark)."""
    if not is_gbnf(text):
        return from_lark(text, name)
    from llguidance.gbnf_to_lark import GbnfToLarkError

    from .gbnf import gbnf_as_lark

    try:
        lark = gbnf_as_lark(text)
    except RecursionError:
        raise GrammarError(f"{name} is not a usable GBNF grammar: it nests too deeply") from None
    except Exception as e:  # the converter's parse errors, and plain Exceptions for a missing rule
        if not isinstance(e, GbnfToLarkError) and type(e) is not Exception:
            raise  # ours: a bug, not the grammar's
        raise GrammarError(f"{name} is not a usable GBNF grammar: {_one_line(str(e))}") from None
    import llguidance

    compiled = llguidance.LLMatcher.grammar_from_lark(lark)
    _check(compiled, f"{name} is not a usable GBNF grammar")
    _probe(compiled, f"{name} is not a usable GBNF grammar", "it matches no text (does a rule only refer to itself?)")
    return Grammar("grammar", text, compiled)


def from_lark(text: str, name: str = "the grammar") -> Grammar:
    """A Lark grammar in llguidance's dialect (`start:` rule, terminals in capitals, /regex/,
    %json {schema} for embedded JSON)."""
    import llguidance

    compiled = llguidance.LLMatcher.grammar_from_lark(text)
    _check(compiled, f"{name} is not a usable Lark grammar")
    _probe(compiled, f"{name} is not a usable Lark grammar", "it matches no text (does a rule only refer to itself?)")
    return Grammar("grammar", text, compiled)


class GrammarCompiler:
    """Grammars bound to one tokenizer; `constraint(grammar)` gives a fresh per-sequence matcher."""

    def __init__(self, tokenizer: Tokenizer):
        import llguidance

        if not tokenizer.eos_ids:
            raise UnsupportedModelError("this model declares no end-of-sequence token, which constrained output needs")
        try:  # llguidance reads the same `tokenizers` JSON our Tokenizer is backed by
            self.lltok = llguidance.LLTokenizer(tokenizer.backend.to_str(), eos_token=sorted(tokenizer.eos_ids))
        except (ValueError, RuntimeError) as e:
            raise UnsupportedModelError(f"this model's tokenizer cannot be used for constrained output ({_one_line(str(e))})") from None

    def constraint(self, grammar: Grammar) -> "TokenConstraint":
        import llguidance

        matcher = llguidance.LLMatcher(self.lltok, grammar.compiled, log_level=0)
        if matcher.is_error():
            raise GrammarError(_one_line(matcher.get_error()))
        return TokenConstraint(matcher, self.lltok.vocab_size, self.lltok.eos_token, whole_reply=grammar.whole_reply)


@dataclass
class TokenConstraint:
    """One sequence's matcher. Keeps the time spent on masks and advances, to compare with decode steps."""

    matcher: object  # llguidance.LLMatcher
    vocab_size: int  # the tokenizer's; the model's logits may be wider (padded), those extra ids are forbidden
    end_token: int  # what generate() yields when the grammar is complete: an end-of-sequence id
    whole_reply: bool = False  # Grammar.whole_reply: think_first.py gives it the thinking's tokens too
    seconds: float = 0.0  # total time in mask() and advance()
    first_s: float = 0.0  # the first mask (llguidance builds lexer state lazily: a few ms)
    tokens: int = 0
    _words: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        self._words = np.zeros((self.vocab_size + 31) // 32, dtype=np.int32)  # bit t of word w: token 32w + t

    def forbidden(self, width: int) -> np.ndarray:
        """(width,) bool: the tokens the grammar does not allow next (ids past the tokenizer's included)."""
        self.matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        if self.matcher.is_error():
            raise InvalidOutputError(f"the grammar failed: {_one_line(self.matcher.get_error())}")
        if not self._words.any():
            raise InvalidOutputError("the grammar allows no token here; this is a bug, please report it")
        allowed = np.unpackbits(self._words.view(np.uint8), bitorder="little")
        out = np.ones(width, dtype=bool)
        n = min(width, self.vocab_size)
        out[:n] = allowed[:n] == 0
        return out

    def mask(self, logits):
        """logits (V,) float, a numpy array or a torch tensor, with every token the grammar forbids at
        -inf (a new array or tensor)."""
        t0 = time.perf_counter()
        forbidden = self.forbidden(logits.shape[-1])
        if isinstance(logits, np.ndarray):
            out = logits.copy()
            out[forbidden] = -np.inf
            self._spent(t0, first=self.tokens == 0)
            return out
        import torch

        if logits.device.type == "cpu" and logits.dtype == torch.float32:
            # in numpy, single-threaded: torch would split 50k-element ops over its threads, which
            # costs far more than the work when other processes share the cores
            out = logits.numpy().copy()
            out[forbidden] = -np.inf
            out = torch.from_numpy(out)
        else:
            out = logits.masked_fill(torch.from_numpy(forbidden).to(logits.device), float("-inf"))
        self._spent(t0, first=self.tokens == 0)
        return out

    def advance(self, token: int) -> None:
        t0 = time.perf_counter()
        if not self.matcher.consume_token(token):
            error = _one_line(self.matcher.get_error())
            if _OVER_LIMITS.search(error):  # the grammar outgrew llguidance's limits: not a bug of ours
                raise GrammarError(f"the grammar is too large for the constraint engine ({error}); simplify it, "
                                   "e.g. * or + instead of long counted repetitions")
            raise InvalidOutputError(f"the grammar rejected token {token} ({error}); this is a bug, please report it")
        self.tokens += 1
        self._spent(t0)

    def is_done(self) -> bool:
        """Nothing but an end token can follow."""
        return self.matcher.is_stopped()

    def is_accepting(self) -> bool:
        """The text so far is complete (it may still go on)."""
        return self.matcher.is_accepting()

    @property
    def mean_s(self) -> float:
        """Mean time per token in mask() + advance(), the first mask excluded."""
        return (self.seconds - self.first_s) / max(1, self.tokens - 1)

    def _spent(self, t0: float, first: bool = False) -> None:
        dt = time.perf_counter() - t0
        self.seconds += dt
        if first:
            self.first_s += dt


def incomplete_message(grammar: Grammar, tokens: int, max_tokens: int | None) -> str:
    """What to say when generation stopped (finish_reason "length") before the grammar was complete."""
    fix = "raise -n/--max-tokens" if max_tokens is not None and tokens >= max_tokens else "raise --ctx-size or shorten the prompt"
    return f"the output was cut at {tokens} tokens before {grammar.what} was complete; {fix}"


# ---------------------------------------------------------------------------- helpers


def _read(path: Path, flag: str) -> str:
    """A regular text file (a FIFO or /dev/zero is refused before it is read)."""
    try:
        return read_text_file(path, flag)
    except InvalidParameterError as e:
        raise GrammarError(str(e)) from None


def _validator(schema):
    """The jsonschema validator class of the schema's own `$schema` draft (2020-12 when it names none)."""
    import jsonschema

    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema) \
        if not isinstance(schema, bool) else jsonschema.Draft202012Validator(schema)


# llguidance's resource limits (LLParserLimits): the lexer's expressions and fuel, the parser's items
_OVER_LIMITS = re.compile(r"too many expressions|fuel|max_items|too many (lexer )?states|limit", re.IGNORECASE)


@lru_cache(maxsize=1)
def _byte_tokenizer():
    """llguidance's view of a 257-token vocabulary: the 256 bytes and an end token."""
    import llguidance
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken("<end>", special=True)])
    return llguidance.LLTokenizer(backend.to_str(), eos_token=[len(alphabet)])


def _probe(compiled: str, what: str, empty: str) -> None:
    """The grammar's first step on a byte vocabulary, before any model loads: a grammar that cannot
    start (llguidance's NoExtensionBias: {"$ref": "#"}, a rule that only refers to itself) is
    refused here, with `empty` saying why, instead of failing at the first token. Other errors
    are left for the model's own vocabulary to judge (a Lark grammar may name its special tokens)."""
    import llguidance

    matcher = llguidance.LLMatcher(_byte_tokenizer(), compiled, log_level=0)
    if not matcher.is_error():
        words = np.zeros(9, dtype=np.int32)  # 257 bits
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
    if matcher.is_error() and "NoExtensionBias" in matcher.get_error():
        raise GrammarError(f"{what}: {empty}")


def _check(compiled: str, what: str) -> None:
    import llguidance

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled)
    if is_error:
        raise GrammarError(f"{what}: {_one_line(messages[0])}")


def _one_line(message: str) -> str:
    """llguidance's and the regex parser's messages span lines (a caret under the source); keep the
    part that says what is wrong."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    said = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    return f"{lines[0].rstrip(':')}: {said[0]}" if said and not lines[0].startswith("error: ") else lines[0]


def _python_regex(pattern: str):
    """The pattern compiled by Python's `re`, or None where Rust syntax differs (then the matcher's
    own acceptance is the check)."""
    try:
        return re.compile(pattern)
    except re.error:
        return None
