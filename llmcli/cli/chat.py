"""`llmcli chat [MODEL]`: the flags of `run` plus --system, --load, --single, --render -> the REPL."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import InvalidParameterError
from .options import (ChatTemplateFile, ContextShift, CtxSize, Device, Dtype, FrequencyPenalty, GrammarFile,
                      JsonSchema, KvOffload, KvType, MaxTokens, MinP, Offline, PresencePenalty, Quant, ReasoningBudget,
                      Regex, RegistryFile, RepeatLastN, RepeatPenalty, Seed, Stop, System, Temp, Think, Threads,
                      ToolChoice, ToolsFile, TopK, TopP, check_text_options, check_thinks, model_flags, read_chat_template,
                      read_grammar, read_tools, report_plan, sampling_params, stderr_console)

# the default is runtime.flags.DEFAULT_MODEL
ChatModel = Annotated[Optional[str], typer.Argument(
    help="A model name, a .gguf file or a model folder (default: smollm2:135m).", show_default=False)]
# flag -> SamplingParams field, for the flags given on the command line that override a --load file
_SAMPLING_FIELDS = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                    "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
                    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "seed": "seed"}


def chat(
    ctx: typer.Context,
    model: ChatModel = None,
    temp: Temp = 0.8, top_k: TopK = 40, top_p: TopP = 0.95, min_p: MinP = 0.05,
    repeat_penalty: RepeatPenalty = 1.0, repeat_last_n: RepeatLastN = 64,
    presence_penalty: PresencePenalty = 0.0, frequency_penalty: FrequencyPenalty = 0.0,
    seed: Seed = -1, max_tokens: MaxTokens = None, stop: Stop = None, ctx_size: CtxSize = None,
    system: System = None,
    load: Annotated[Optional[Path], typer.Option("--load", help="Continue a conversation saved with /save.",
                                                 show_default=False)] = None,
    single: Annotated[bool, typer.Option("--single", help="Piped: all of stdin is one message (default: one per line).")] = False,
    render: Annotated[bool, typer.Option("--render", help="Render replies as Markdown at a terminal.")] = False,
    device: Device = "auto", dtype: Dtype = "auto", threads: Threads = None, quant: Quant = None,
    compile: Annotated[Optional[bool], typer.Option("--compile/--no-compile", help="Compile the decode step with torch.compile; default: at a terminal, in the background while you type.", show_default=False)] = None,
    kv_type: KvType = "auto", kv_offload: KvOffload = "auto", context_shift: ContextShift = False,
    json_schema: JsonSchema = None, regex: Regex = None, grammar: GrammarFile = None,
    tools_file: ToolsFile = None, tool_choice: ToolChoice = "auto", chat_template_file: ChatTemplateFile = None,
    think: Think = None, reasoning_budget: ReasoningBudget = None,
    registry: RegistryFile = None, offline: Offline = False,
):
    """Chat with a model: a REPL at a terminal (/? lists its commands); piped, one message per line."""
    from ..chat import conversation
    from ..chat.session import ChatSession
    from ..decode.request import Request
    from ..runtime.flags import DEFAULT_MODEL
    from ..runtime.lean import open_lean
    from . import repl
    from .startup import opening

    request = Request(sampling_params(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty,
                                      frequency_penalty, seed),
                      max_tokens, tuple(stop or ()), grammar=read_grammar(json_schema, regex, grammar),
                      **read_tools(tools_file, tool_choice), context_shift=context_shift, think=think,
                      reasoning_budget=reasoning_budget)  # every reply follows it
    check_text_options(system)
    template = read_chat_template(chat_template_file)
    if single and sys.stdin.isatty():  # before the model loads, to fail at once
        raise InvalidParameterError("--single reads the message from stdin; pipe it in, "
                                    "e.g. `cat notes.txt | llmcli chat --single`")
    conv = conversation.Conversation(system, params=request.sampling, max_tokens=max_tokens, stop=request.stop)
    if load is not None:  # read it before the model loads, so a bad file fails at once
        conv = _with_flags(conversation.load(load), conv, _given(ctx))
    err = stderr_console()
    with opening(err) as progress:
        flags = model_flags(model or DEFAULT_MODEL, device=device, dtype=dtype, threads=threads, ctx_size=ctx_size,
                            quant=quant, kv_type=kv_type, kv_offload=kv_offload, registry=registry, offline=offline,
                            chat_template=template)
        rt = open_lean(flags, request, progress)  # the torch-free path where it runs the model (runtime/lean.py)
        if rt is None:
            from ..runtime.runtime import open_model

            rt = open_model(flags, progress)
    check_thinks(rt, request)
    report_plan(err, rt, verbose=False)
    session = ChatSession(rt, conv, _decode_step(rt, compile), request)
    raise typer.Exit(repl.run(session, render=render, single=single, check_model=load is not None))


def _given(ctx: typer.Context) -> set[str]:
    """The parameters typed on the command line (not left at their defaults)."""
    return {name for name in ctx.params
            if getattr(ctx.get_parameter_source(name), "name", "") in ("COMMANDLINE", "ENVIRONMENT")}


def _with_flags(saved, flags, given: set[str]):
    """A loaded conversation keeps its own parameters, except those given as flags now."""
    changes = {_SAMPLING_FIELDS[g]: getattr(flags.params, _SAMPLING_FIELDS[g]) for g in given if g in _SAMPLING_FIELDS}
    saved.params = saved.params.with_(**changes)
    if "system" in given:
        saved.system = flags.system
    if "max_tokens" in given:
        saved.max_tokens = flags.max_tokens
    if "stop" in given:
        saved.stop = flags.stop
    return saved


def _decode_step(rt, compile: bool | None):
    """At a terminal the graph compiles in the background while the user types; piped input is
    usually short, so it runs eagerly unless --compile asks."""
    interactive = sys.stdin.isatty()
    if compile is None:
        compile = interactive
    return rt.decode_step(compile, background=interactive)
