"""Quantization presets: TOML files of rules that map tensor names to a format.

A preset (the shipped ones live in the top-level `quant/` folder; `--preset FILE` takes a user's):

    description = "4-bit, groups of 32, with a zero point"
    on_indivisible = "fallback"     # a group size that does not divide a row: "fallback" | "refuse"
    dtype = "bfloat16"              # for tensors kept unquantized: "bfloat16" | "float16" | "float32"
    activations = "int8"            # what the CPU kernels multiply GGUF blocks with: "int8" (llama.cpp's)
                                    # | "int8x2" (16-bit codes as two int8 rows: ~15 bits, ~2x prefill work)

    [[rules]]                       # the first rule that matches a tensor decides its format
    match = ["model.embed_tokens.weight", "lm_head.weight"]    # globs over Hugging Face names
    layers = ["first_eighth", "last_eighth", "every_third"]   # optional: only these layer indices
    bits = 8                        # 4 | 8 | 16 (16: not quantized)
    group_size = 32                 # 32 (default) | 64 | 128 | 256 | "row" (8-bit only)
    symmetric = true                # 4-bit: false (a zero point per group) or true; 8-bit: true
    format = "int"                  # "int" (default) | "nf4" | "llm_int8" (bitsandbytes' formats)

`layers` takes indices (negative counts from the end) and llama.cpp's selectors for its mixed
types: first_eighth (i < n/8), last_eighth (i >= 7n/8), every_third ((i - n/8) % 3 == 2).
Tensors no rule matches, and 1-D tensors (norms, biases), are not quantized.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path

import tomllib

from ..errors import InvalidParameterError, LlmcliError
from ..text_input import read_text_file

GROUP_SIZES = (32, 64, 128, 256)
LAYER_SELECTORS = ("first_eighth", "last_eighth", "every_third")
_RULE_KEYS = {"match", "layers", "bits", "group_size", "symmetric", "format"}
FORMATS = ("int", "nf4", "llm_int8")
_TOP_KEYS = {"description", "on_indivisible", "dtype", "activations", "rules"}
ACTIVATIONS = ("int8", "int8x2")  # the native kernels' activations (kernels.h's Q8Rows::refined: int8x2)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
ROW_KINDS = ("F16", "BF16")  # 16-bit floats kept as GGUF rows (gguf_blocks.py's FLOAT_ROWS): packed, not quantized


class PresetError(LlmcliError):
    """A preset that does not exist, or a preset file with a mistake (the message has file:line)."""

    exit_code = 2


@dataclass(frozen=True)
class QuantSpec:
    """One tensor's format. bits 16 means "keep it in floating point"."""

    bits: int
    group_size: int | None = None  # None: one group per row
    symmetric: bool = True
    kind: str = "int"  # "int" (llmcli's group-wise formats) | "nf4" | "llm_int8" (bitsandbytes')
    #                    | a GGUF type kept as its blocks: "Q5_0" | "Q5_1" | "Q5_K" | "Q6_K" | ... | "F16" | "BF16"

    @property
    def quantized(self) -> bool:
        """Held packed: fewer than 16 bits, or 16-bit floats held as GGUF F16/BF16 rows."""
        return self.bits < 16 or self.kind in ROW_KINDS

    @property
    def blocks(self) -> bool:
        """A GGUF type kept as its blocks (gguf_blocks.py)."""
        return self.kind.startswith("Q") or self.kind in ROW_KINDS

    def name(self) -> str:
        if not self.quantized:
            return "float"
        if self.blocks:
            return self.kind
        group = "row" if self.group_size is None else f"g{self.group_size}"
        if self.kind != "int":
            return self.kind if self.kind == "llm_int8" else f"{self.kind}_{group}"
        return f"int{self.bits}_{group}" + ("_sym" if self.bits == 4 and self.symmetric else "")

    def as_json(self) -> dict:
        d = {"bits": self.bits, "group_size": self.group_size, "symmetric": self.symmetric}
        return d if self.kind == "int" else {**d, "format": self.kind}

    @classmethod
    def from_json(cls, d: dict) -> "QuantSpec":
        return cls(int(d["bits"]), d.get("group_size"), bool(d.get("symmetric", True)), d.get("format", "int"))


KEEP = QuantSpec(16)


@dataclass(frozen=True)
class Rule:
    patterns: tuple[str, ...]
    layers: tuple = ()  # ints and selector names; empty: any tensor, in a layer or not
    spec: QuantSpec = KEEP
    line: int = 0

    def matches(self, name: str, n_layers: int) -> bool:
        if not any(fnmatch.fnmatchcase(name, p) for p in self.patterns):
            return False
        if not self.layers:
            return True
        m = _LAYER.search(name)
        return m is not None and _layer_selected(int(m.group(1)), n_layers, self.layers)


def _layer_selected(i: int, n: int, layers: tuple) -> bool:
    for sel in layers:
        if isinstance(sel, int) and (i == sel or i == n + sel):
            return True
        if sel == "first_eighth" and i < n // 8:
            return True
        if sel == "last_eighth" and i >= 7 * n // 8:
            return True
        if sel == "every_third" and i >= n // 8 and (i - n // 8) % 3 == 2:
            return True
    return False


@dataclass
class Preset:
    name: str
    rules: list[Rule]
    description: str = ""
    on_indivisible: str = "fallback"
    dtype: str = "bfloat16"
    source: str = ""  # the file it came from, for messages
    activations: str = "int8"  # ACTIVATIONS: how the native kernels quantize activations for its blocks
    notes: list[str] = field(default_factory=list)  # filled by `spec_for` (group size fallbacks)

    @property
    def quantizes(self) -> bool:
        return any(r.spec.quantized for r in self.rules)

    @cached_property
    def _by_name(self) -> tuple[dict[str, int], list[tuple[int, Rule]]]:
        """{tensor name: index of the first rule naming it exactly}, and the other rules with their
        index. A GGUF's as-stored preset has a rule per tensor: scanning them all for each of its
        tensors is quadratic in the tensors. (Rules are not changed after a preset is made.)"""
        exact: dict[str, int] = {}
        others = []
        for i, r in enumerate(self.rules):
            if r.layers or any(c in p for p in r.patterns for c in "*?["):
                others.append((i, r))
            else:
                for p in r.patterns:
                    exact.setdefault(p, i)
        return exact, others

    def _first_rule(self, name: str, n_layers: int) -> Rule | None:
        """The first rule that matches `name`, as a scan of self.rules in order finds it."""
        exact, others = self._by_name
        first = exact.get(name, len(self.rules))
        found = next((i for i, r in others if i < first and r.matches(name, n_layers)), first)
        return self.rules[found] if found < len(self.rules) else None

    def spec_for(self, name: str, shape: tuple[int, ...], n_layers: int) -> QuantSpec:
        """The format of tensor `name` (a weight of `shape`): the first matching rule's, adjusted
        when its group size does not divide the row length (or an error, as the preset says)."""
        if len(shape) != 2:
            return KEEP
        rule = self._first_rule(name, n_layers)
        if rule is None or not rule.spec.quantized:
            return KEEP
        spec, K = rule.spec, shape[1]
        if spec.group_size is None or K % spec.group_size == 0:
            return spec
        where = f"{self.source}:{rule.line}" if self.source else f"preset {self.name}"
        if self.on_indivisible == "refuse":
            raise PresetError(f"{name} has rows of {K} values, which groups of {spec.group_size} do not divide "
                              f"({where}); pick a group size that divides {K} or set on_indivisible = \"fallback\"")
        smaller = [g for g in GROUP_SIZES if g < spec.group_size and K % g == 0]
        fallback = QuantSpec(spec.bits, max(smaller), spec.symmetric, spec.kind) if smaller else KEEP
        self.notes.append(f"{name}: rows of {K} are not divisible by {spec.group_size}; "
                          f"using {fallback.name() if fallback.quantized else 'no quantization'}")
        return fallback


# ------------------------------------------------------------------------------------ reading


def shipped_dir() -> Path:
    """The presets shipped with llmcli: in the wheel (llmcli/data/quant) or in a checkout (quant/)."""
    packaged = resources.files("llmcli") / "data" / "quant"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "quant"


def shipped_names() -> list[str]:
    return sorted(p.stem for p in shipped_dir().glob("*.toml"))


def load_preset(name_or_path: str | Path) -> Preset:
    """A shipped preset by name (`q4`), or a TOML file by path."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if text.endswith(".toml") or path.is_file() or "/" in text:
        if not path.exists():
            raise PresetError(f"preset file {path} does not exist")
        try:  # a regular UTF-8 text file (a Latin-1 file or a FIFO is one error line)
            text = read_text_file(path, "preset file")
        except InvalidParameterError as e:
            raise PresetError(str(e)) from None
        return parse_preset(text, path.stem, str(path))
    shipped = shipped_dir() / f"{text}.toml"
    if not shipped.is_file():
        raise PresetError(f"unknown preset {text!r}; choose one of {', '.join(shipped_names())} or pass a .toml file")
    return parse_preset(shipped.read_text(encoding="utf-8"), text, str(shipped))


def parse_preset(text: str, name: str, source: str = "<preset>") -> Preset:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = re.search(r"line (\d+)", str(e))
        raise PresetError(f"{source}:{line.group(1) if line else '?'}: not valid TOML ({str(e).split(' (at')[0]})") from None
    except RecursionError:  # tomllib recurses per nested array or inline table
        raise PresetError(f"{source}: not a usable preset: the TOML nests too deeply") from None
    rule_lines = [i + 1 for i, ln in enumerate(text.splitlines()) if re.match(r"\s*\[\[\s*rules\s*\]\]", ln)]

    def fail(message: str, line: int | None = None, key: str | None = None):
        if line is None and key is not None:
            line = next((i + 1 for i, ln in enumerate(text.splitlines()) if re.match(rf"\s*{key}\s*=", ln)), None)
        raise PresetError(f"{source}:{line or '?'}: {message}")

    for key in data:
        if key not in _TOP_KEYS:
            fail(f"unknown key {key!r}; a preset has {', '.join(sorted(_TOP_KEYS))}", key=key)
    on_indivisible = data.get("on_indivisible", "fallback")
    if on_indivisible not in ("fallback", "refuse"):
        fail(f"on_indivisible must be \"fallback\" or \"refuse\", got {on_indivisible!r}", key="on_indivisible")
    dtype = data.get("dtype", "bfloat16")
    if dtype not in ("bfloat16", "float16", "float32"):
        fail(f"dtype must be \"bfloat16\", \"float16\" or \"float32\", got {dtype!r}", key="dtype")
    activations = data.get("activations", "int8")
    if activations not in ACTIVATIONS:
        fail(f"activations must be \"int8\" or \"int8x2\", got {activations!r}", key="activations")
    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        fail("a preset needs at least one [[rules]] table", key="rules")
    rules = [_parse_rule(r, rule_lines[i] if i < len(rule_lines) else None, i + 1, fail) for i, r in enumerate(raw_rules)]
    return Preset(name, rules, str(data.get("description", "")), on_indivisible, dtype, source, activations=activations)


def _parse_rule(raw: dict, line: int | None, index: int, fail) -> Rule:
    def bad(message: str):
        fail(f"rule {index}: {message}", line)

    unknown = set(raw) - _RULE_KEYS
    if unknown:
        bad(f"unknown key {sorted(unknown)[0]!r}; a rule has {', '.join(sorted(_RULE_KEYS))}")
    match = raw.get("match")
    patterns = (match,) if isinstance(match, str) else tuple(match) if isinstance(match, list) else ()
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        bad("match must be a tensor-name glob or a list of them, e.g. match = \"*.mlp.down_proj.weight\"")
    layers = raw.get("layers", [])
    if not isinstance(layers, list) or not all(
            (isinstance(s, int) and not isinstance(s, bool)) or s in LAYER_SELECTORS for s in layers):
        bad(f"layers must be a list of layer indices or of {', '.join(LAYER_SELECTORS)}")
    kind = raw.get("format", "int")
    if kind not in FORMATS:
        bad(f"format must be one of {', '.join(FORMATS)}, got {kind!r}")
    bits = raw.get("bits", {"nf4": 4, "llm_int8": 8}.get(kind))
    if bits not in (4, 8, 16) or isinstance(bits, bool):
        bad(f"bits must be 4, 8 or 16, got {bits!r}")
    if bits == 16:
        return Rule(patterns, tuple(layers), KEEP, line or 0)
    if kind == "nf4":
        group = raw.get("group_size", 64)
        if bits != 4 or group not in (64, 128, 256):
            bad("format \"nf4\" is 4-bit with group_size 64, 128 or 256")
        return Rule(patterns, tuple(layers), QuantSpec(4, group, True, "nf4"), line or 0)
    if kind == "llm_int8":
        if bits != 8 or raw.get("group_size", "row") != "row":
            bad("format \"llm_int8\" is 8-bit with one scale per row (group_size = \"row\")")
        return Rule(patterns, tuple(layers), QuantSpec(8, None, True, "llm_int8"), line or 0)
    group = raw.get("group_size", 32)
    if group == "row":
        if bits != 8:
            bad("group_size = \"row\" is for 8 bits; 4-bit weights need groups of 32, 64, 128 or 256")
        group = None
    elif group not in GROUP_SIZES or isinstance(group, bool):
        bad(f"group_size must be one of 32, 64, 128, 256 or \"row\", got {group!r}")
    symmetric = raw.get("symmetric", bits == 8)
    if not isinstance(symmetric, bool):
        bad(f"symmetric must be true or false, got {symmetric!r}")
    if bits == 8 and not symmetric:
        bad("8-bit quantization is symmetric only; set symmetric = true or remove it")
    return Rule(patterns, tuple(layers), QuantSpec(bits, group, symmetric), line or 0)


def check_preset_name(value: str | None) -> Preset | None:
    """For CLI options: None stays None, anything else must load."""
    if value is None:
        return None
    if not value.strip():
        raise InvalidParameterError(f"--quant needs a preset name ({', '.join(shipped_names())}) or a .toml file")
    return load_preset(value)
