"""`llmcli run MODEL [PROMPT]`: one answer, streamed to stdout (or one JSON object with --json)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

from ..errors import InvalidParameterError
from .options import (Beams, ChatTemplateFile, Compile, ContextShift, CtxSize, Device, Draft, DraftQuant, DraftTokens,
                      Dtype, FrequencyPenalty, GrammarFile, JsonSchema, KvOffload, KvType, LengthPenalty, Lookup,
                      LookupNgram, MaxTokens, MinP, ModelArg, Offline, PresencePenalty, Quant, Regex, RegistryFile,
                      ReasoningBudget, RepeatLastN, RepeatPenalty, Seed, ShowThinking, Stop, System, Temp, Think,
                      Threads, ToolChoice, ToolsFile, TopK, TopP, Verbose, check_text_options, check_thinks,
                      model_flags, read_chat_template, read_grammar, read_tools, report_plan, sampling_params,
                      stderr_console)

Prompt = Annotated[Optional[str], typer.Argument(help="The prompt; read from stdin when absent or '-'.", show_default=False)]
Raw = Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON object at the end instead of streaming text.")]
IgnoreEos = Annotated[bool, typer.Option("--ignore-eos", help="Go on past the model's end-of-sequence token (until -n or the context ends it).")]
LogprobsN = Annotated[Optional[int], typer.Option("--logprobs", help="With --json: each token's log-probability and the N (0-20) most likely alternatives.", show_default=False)]


def run(
    model: ModelArg, prompt: Prompt = None,
    temp: Temp = 0.8, top_k: TopK = 40, top_p: TopP = 0.95, min_p: MinP = 0.05,
    repeat_penalty: RepeatPenalty = 1.0, repeat_last_n: RepeatLastN = 64,
    presence_penalty: PresencePenalty = 0.0, frequency_penalty: FrequencyPenalty = 0.0,
    seed: Seed = -1, max_tokens: MaxTokens = None, stop: Stop = None, ctx_size: CtxSize = None,
    system: System = None, raw: Raw = False, ignore_eos: IgnoreEos = False,
    device: Device = "auto", dtype: Dtype = "auto", threads: Threads = None, quant: Quant = None,
    compile: Compile = False,
    kv_type: KvType = "auto", kv_offload: KvOffload = "auto", context_shift: ContextShift = False,
    beams: Beams = 1, length_penalty: LengthPenalty = 1.0,
    draft: Draft = None, draft_quant: DraftQuant = None, draft_tokens: DraftTokens = None,
    lookup: Lookup = False, lookup_ngram: LookupNgram = 3,
    json_out: JsonOut = False, json_schema: JsonSchema = None, regex: Regex = None, grammar: GrammarFile = None,
    tools_file: ToolsFile = None, tool_choice: ToolChoice = "auto", chat_template_file: ChatTemplateFile = None,
    logprobs: LogprobsN = None, think: Think = None, reasoning_budget: ReasoningBudget = None,
    show_thinking: ShowThinking = False,
    verbose: Verbose = False, registry: RegistryFile = None, offline: Offline = False,
):
    """Generate one answer to PROMPT and stream it to stdout."""
    from ..decode.request import Request

    if draft is not None and lookup:
        raise InvalidParameterError("--draft and --lookup are two ways to guess tokens; choose one")
    request = Request(sampling_params(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty,
                                      frequency_penalty, seed),
                      max_tokens, tuple(stop or ()), ignore_eos, read_grammar(json_schema, regex, grammar),
                      **read_tools(tools_file, tool_choice), logprobs=logprobs, beams=beams,
                      length_penalty=length_penalty, guesses="draft" if draft else "lookup" if lookup else None,
                      draft_tokens=draft_tokens, lookup_ngram=lookup_ngram, context_shift=context_shift,
                      think=think, reasoning_budget=reasoning_budget)
    check_text_options(system)
    if logprobs is not None and not json_out:
        raise InvalidParameterError("--logprobs needs --json: the log-probabilities are part of the JSON object")
    template = read_chat_template(chat_template_file)
    text = read_prompt(prompt)
    flags = model_flags(model, device=device, dtype=dtype, threads=threads, ctx_size=ctx_size, quant=quant,
                        kv_type=kv_type, kv_offload=kv_offload, registry=registry, offline=offline,
                        chat_template=template)
    err = stderr_console()
    rt, draft_rt = _open(err, flags, draft, draft_quant, text, request)
    check_thinks(rt, request)
    report_plan(err, rt, verbose)
    if verbose:
        _report_model(err, rt)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    thoughts = ThinkingWriter(sys.stderr) if show_thinking or verbose else None
    answer = _answer(rt, draft_rt, messages, request, raw, compile, held=json_out or request.constrained,
                     thoughts=thoughts)
    _print_result(err, rt, request, answer, json_out, verbose)


def read_prompt(prompt: str | None) -> str:
    """PROMPT, or all of stdin for none or '-'; empty text is an error."""
    from ..text_input import check_text, read_stdin

    if prompt is not None and prompt != "-":
        if not prompt.strip():
            raise InvalidParameterError("the prompt is empty; pass some text")
        return check_text(prompt, "the prompt")
    if sys.stdin is None or sys.stdin.isatty():
        raise InvalidParameterError("no prompt: pass PROMPT as an argument or pipe it on stdin (or use `llmcli chat`)")
    text = read_stdin()
    if not text.strip():
        raise InvalidParameterError("stdin was empty; pipe some text in or pass PROMPT as an argument")
    return text


def _open(err, flags, draft: str | None, draft_quant: str | None, sample: str, request):
    """The model (on the torch-free path where it runs it: runtime/lean.py), and the draft model for
    --draft (checked to speak the same tokens)."""
    from ..runtime.lean import open_lean
    from .startup import opening

    with opening(err) as progress:
        rt = open_lean(flags, request, progress) if draft is None else None
        if rt is not None:
            return rt, None
        from ..decode.speculative import check_draft
        from ..runtime.runtime import open_model

        rt = open_model(flags, progress)
        draft_rt = None
        if draft is not None:
            draft_rt = open_model(flags.with_(model=draft, quant=draft_quant, ctx_size=rt.ctx_size, kv_type=None,
                                              kv_offload="auto"), progress)
            check_draft(rt.loaded, draft_rt.loaded, sample)
    return rt, draft_rt


def _report_model(err, rt) -> None:
    err.print(f"[dim]{rt.placement.reason}[/dim]")
    a = rt.loaded.args
    copied, seconds = rt.loaded.interleaved
    interleaved = f", {seconds:.2f} s of it copying {copied / 2**20:.0f} MiB interleaved for the kernels" if copied else ""
    err.print(f"[dim]loaded {rt.loaded.name} ({a.model_type}, {a.num_hidden_layers} layers, "
              f"{rt.loaded.runs_as}) in {rt.loaded.load_seconds:.2f} s{interleaved}; context {rt.ctx_size}[/dim]")
    if rt.registry_quant:
        err.print(f"[dim]the registry's {rt.registry_quant} is quantized at load; --quant picks another preset[/dim]")


class _Answer:
    """What generation produced: the text (streamed already unless held), the last chunk, and what
    rode along (the grammar, the Generation with its constraint and logprobs, the context shift)."""

    def __init__(self, held: bool):
        self.held = held  # --json, a grammar or tools: printed at the end, not streamed
        self.pieces: list[str] = []
        self.thoughts: list[str] = []  # a reasoning model's thinking (never on stdout)
        self.last = None
        self.grammar = self.generation = self.shift = None
        self.reader = None  # formats.tool_reply.CallReader, with --tools
        self.calls_whole = True  # with --tools: the reply did not end inside a call
        self.step = ""  # how decode steps ran (Runtime.describe_step)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def reasoning(self) -> str:
        return "".join(self.thoughts)


class ThinkingWriter:
    """A reasoning model's thinking as it comes, on `stream` (stderr), dimmed at a terminal; a line
    break once it is over, before the answer."""

    def __init__(self, stream):
        import os

        self.stream = stream
        self.dim = stream.isatty() and not os.environ.get("NO_COLOR")
        self.open = False

    def write(self, text: str) -> None:
        if text:
            self.stream.write(("\x1b[2m" if self.dim and not self.open else "") + text)
            self.open = True
            self.stream.flush()

    def close(self) -> None:
        if self.open:
            self.stream.write(("\x1b[0m" if self.dim else "") + "\n")
            self.stream.flush()
            self.open = False


def _answer(rt, draft_rt, messages, request, raw: bool, compile: bool, held: bool, thoughts=None) -> _Answer:
    """Generate, streaming the text to stdout as it comes unless it is `held` for the end (a
    reply with tools may be calls); a reasoning model's thinking goes to `thoughts`
    (a ThinkingWriter) where it is shown."""
    from ..decode.stream import output_limit

    out = _Answer(held)
    ids = rt.prompt_ids(messages, raw=raw, tools=request.tools, request=request)
    out.grammar, out.reader = rt.grammar(request), rt.call_reader(request)
    if request.beams > 1 and rt.plan is not None:  # the search's own cache: beams x (prompt + answer)
        answer_room = output_limit(len(ids), rt.ctx_size, request.max_tokens)
        rt.plan.check_rows(request.beams, len(ids), answer_room, f"--beams {request.beams}")
    out.shift = rt.context_shift(messages, raw) if request.context_shift else None
    step = rt.decode_step(compile)
    out.step = rt.describe_step(step)
    draft = draft_rt.draft(rt.ctx_size, compile) if draft_rt is not None else None
    out.generation = rt.generate(ids, request, rt.new_cache(), step, shift=out.shift, draft=draft)
    for chunk in out.generation:
        out.thoughts.append(chunk.reasoning)
        if thoughts is not None:
            thoughts.write(chunk.reasoning)
            if chunk.text or chunk.finish_reason is not None:
                thoughts.close()
        tokens = [] if chunk.reasoning else chunk.tokens  # (a thinking token is no call's opener)
        text = out.reader.push(chunk.text, tokens)[0] if out.reader else chunk.text
        if out.reader and chunk.finish_reason is not None:
            rest, out.calls_whole = out.reader.finish()
            text += rest
        out.pieces.append(text)
        if not out.held and chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        out.last = chunk
    return out


def calls_json(calls) -> list[dict]:
    """A reply's calls as --tools prints them: [{"name", "arguments": {...}}] (arguments as objects)."""
    return [{"name": c.name, "arguments": c.arguments} for c in calls]


def _print_result(err, rt, request, answer: _Answer, json_out: bool, verbose: bool) -> None:
    """The end of the answer (or its JSON object), then with -v the figures; a grammar's output that
    is incomplete ends in an error after --json's object, which keeps the partial text."""
    last, stats = answer.last, answer.last.stats
    problem = None
    calls = answer.reader.calls if answer.reader is not None else []
    if answer.reader is not None:  # a reply cut inside a call (or before a required one) is no answer
        cut = not answer.calls_whole or (answer.reader.state == "calls" and not calls)
        if last.finish_reason == "length" and cut:
            from ..decode.constrained import incomplete_message
            from ..errors import IncompleteOutputError

            problem = IncompleteOutputError(incomplete_message(answer.grammar, stats.completion_tokens,
                                                               request.max_tokens))
    elif answer.grammar is not None and answer.generation.constraint is not None:  # checked before anything is printed
        problem = check_constrained(answer.grammar, answer.generation.constraint, answer.text, last.finish_reason,
                                    stats, request.max_tokens)
        thinking = getattr(answer.generation.constraint, "reasoning", None)  # (think_first.ThinkFirst)
        if problem is not None and thinking is not None and thinking.thinking:
            from ..errors import IncompleteOutputError

            problem = IncompleteOutputError(
                f"the output was cut at {stats.completion_tokens} tokens while the model was still thinking, before "
                f"{answer.grammar.what} began; raise -n/--max-tokens or cap the thinking with --reasoning-budget")
    if json_out:
        sys.stdout.write(json.dumps(result_json(rt, answer), ensure_ascii=False) + "\n")
    elif problem is None and calls:  # the answer is the calls; text the model wrote before them goes aside
        if answer.text.strip():
            err.print(answer.text.strip(), markup=False, highlight=False)
        sys.stdout.write(json.dumps(calls_json(calls), ensure_ascii=False) + "\n")
    elif problem is None:
        sys.stdout.write(answer.text + "\n" if answer.held else "\n")
    sys.stdout.flush()
    if verbose:
        _report_stats(err, answer)
    plain = stats.extra.get("plain_step_tokens_per_s", 0)
    if plain and stats.decode_tps < plain:  # --draft or --lookup was asked for: say when it cost time
        err.print(f"note: guessing tokens did not pay here ({stats.decode_tps:.1f} t/s against {plain:.1f} t/s for "
                  "plain steps); drop --draft/--lookup for this kind of prompt", markup=False, highlight=False)
    if problem is not None:
        raise problem
    if last.stopped_by == "context":  # never silent: the answer is shorter than asked for
        err.print(f"warning: {context_filled(rt.ctx_size, stats.completion_tokens, request.max_tokens)}",
                  markup=False, highlight=False)


def context_filled(ctx_size: int, tokens: int, max_tokens: int | None) -> str:
    """What to say when the context filled before -n (or, without -n, at all)."""
    before = f" before -n {max_tokens}" if max_tokens is not None else ""
    return (f"the context ({ctx_size} tokens) filled{before}: the answer stops after {tokens} tokens; "
            "raise --ctx-size")


def result_json(rt, answer: _Answer) -> dict:
    """--json's object: text, finish_reason, usage, timings (and logprobs)."""
    stats = answer.last.stats
    calls = answer.reader.calls if answer.reader is not None else []
    finish = "tool_calls" if calls and answer.last.finish_reason == "stop" else answer.last.finish_reason
    out = {"model": rt.loaded.name, "text": answer.text,
           **({"reasoning": answer.reasoning} if rt.reasoning_format is not None else {}), "finish_reason": finish,
           **({"tool_calls": calls_json(calls)} if calls else {}),
           **({"stopped_by": answer.last.stopped_by} if answer.last.stopped_by else {}),
           "usage": {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens,
                     "total_tokens": stats.prompt_tokens + stats.completion_tokens,
                     **({"completion_tokens_details": {"reasoning_tokens": stats.reasoning_tokens}}
                        if rt.reasoning_format is not None else {})},
           "timings": {"load_s": round(rt.loaded.load_seconds, 4), **stats.as_dict()}}
    if answer.generation.logprobs is not None:
        out["logprobs"] = logprobs_json(answer.generation.logprobs, rt.loaded.tokenizer)
    return out


def _report_stats(err, answer: _Answer) -> None:
    stats, constraint = answer.last.stats, answer.generation.constraint
    if constraint is not None:
        step_ms = stats.decode_s / max(1, stats.completion_tokens - 1) * 1000
        err.print(f"[dim]constraint ({answer.grammar.kind}): mask + advance {constraint.mean_s * 1000:.3f} ms/token "
                  f"({constraint.mean_s * 1000 / step_ms:.1%} of a {step_ms:.1f} ms decode step); "
                  f"first mask {constraint.first_s * 1000:.1f} ms[/dim]")
    err.print(f"[dim]{stats.prompt_tokens} prompt tokens, {stats.completion_tokens} generated "
              f"(finish: {answer.last.finish_reason}); ttft {stats.ttft_s * 1000:.0f} ms; "
              f"prefill {stats.prefill_tps:.1f} t/s; decode {stats.decode_tps:.1f} t/s; seed {stats.seed}[/dim]")
    err.print(f"[dim]decode step: {answer.step}[/dim]")
    if stats.reasoning_tokens:
        err.print(f"[dim]thinking: {stats.reasoning_tokens} of the {stats.completion_tokens} tokens[/dim]")
    extra = stats.extra
    if "acceptance_rate" in extra:
        err.print(f"[dim]speculative: {extra['accepted_tokens']} of {extra['draft_tokens']} guessed tokens "
                  f"accepted ({extra['acceptance_rate']:.0%})[/dim]")

    if "beams" in extra:
        err.print(f"[dim]beam search: {extra['beams']} beams, {extra['beam_steps']} steps, "
                  f"best score {extra['beam_score']}[/dim]")
    shift = answer.shift
    if shift is not None and shift.shifts:
        err.print(f"[dim]context shifted {shift.shifts} times, {shift.dropped} tokens dropped "
                  f"(the first {shift.keep} kept)[/dim]")


def check_constrained(grammar, constraint, text: str, finish: str, stats, max_tokens):
    """The error to end with (after --json's object, which keeps the partial text), or None when the
    output is complete and valid. A check that fails here is a bug and raises at once."""
    from ..decode.constrained import incomplete_message
    from ..errors import IncompleteOutputError, InvalidOutputError

    if finish == "length":  # even where the text matches so far: the model had not finished it
        return IncompleteOutputError(incomplete_message(grammar, stats.completion_tokens, max_tokens))
    if not constraint.is_accepting():
        raise InvalidOutputError(f"the output ended before {grammar.what} was complete; this is a bug, please report it")
    grammar.check_output(text)
    return None


def logprobs_json(recorder, tokenizer) -> list[dict]:
    """--json's `logprobs`: per generated token, its text, id and logprob, and the top alternatives."""
    def one(token_id, logprob):
        return {"token": tokenizer.decode([token_id], skip_special=False), "id": token_id, "logprob": round(logprob, 6)}

    return [{**one(t, lp), "top": [one(a, alp) for a, alp in top]} for t, lp, top in recorder.entries]
