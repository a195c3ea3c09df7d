"""`llmcli quantize` and `llmcli perplexity`: make a quantized checkpoint, and measure what it costs.

Progress bars go to stderr; the summary (or one JSON object with --json) to stdout.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import InvalidParameterError
from .options import Device, Dtype, ModelArg, Quant, Threads, model_flags, stderr_console

JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


@contextmanager
def _progress_bar(description: str, enabled: bool = True):
    """A rich progress bar on stderr; yields update(done, total, label)."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

    if not enabled:
        yield lambda *a: None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeRemainingColumn(),
                  TextColumn("[dim]{task.fields[label]}"), console=stderr_console(), transient=True) as bar:
        task = bar.add_task(description, total=None, label="")

        def update(done: int, total: int, label: str = "") -> None:
            bar.update(task, completed=done, total=total, label=label)

        yield update


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


FORMATS = ("llmcli", "gguf")


def quantize(
    model: ModelArg,
    preset: Annotated[str, typer.Option("--preset", "-p", help="A preset (q8, q4, q4_g128, q4_mixed, bf16, f16, f32) or a preset .toml file.")] = "q4",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Folder (or .gguf file) to write (default: ./<model>-<preset>, with .gguf for --format gguf).", show_default=False)] = None,
    out_format: Annotated[str, typer.Option("--format", help="llmcli: a checkpoint folder; gguf: one GGUF file llama.cpp and ollama load (presets in groups of 32: q4 as Q4_1, q8 as Q8_0).")] = "llmcli",
    force: Annotated[bool, typer.Option("--force", help="Replace the output if it exists.")] = False,
    search: Annotated[bool, typer.Option("--search/--no-search", help="Search each group's scale for the least error (--no-search: min/max only, faster).")] = True,
    json_out: JsonOut = False,
):
    """Quantize MODEL with a preset into an llmcli checkpoint folder (run it with `llmcli run DIR`), or a GGUF file."""
    from ..quant.gguf_export import quantize_to_gguf
    from ..quant.pipeline import quantize_to_folder
    from ..quant.presets import load_preset
    from ..runtime.runtime import locate
    from .startup import resume

    if out_format not in FORMATS:
        raise InvalidParameterError(f"--format must be one of {', '.join(FORMATS)}, got {out_format!r}")
    source = locate(model)
    chosen = load_preset(preset)
    resume()  # (it opens no model: its long work collects as usual)
    gguf = out_format == "gguf"
    name = f"{source.stem if source.is_file() else source.name}-{chosen.name}" + (".gguf" if gguf else "")
    out = output if output is not None else Path.cwd() / name
    write = quantize_to_gguf if gguf else quantize_to_folder
    with _progress_bar(f"quantizing ({chosen.name})", sys.stderr.isatty()) as update:
        summary = write(source, chosen, out, force=force, search=search, progress=update)
    err = stderr_console()
    for note in summary.notes:
        err.print(f"[yellow]note:[/yellow] {note}")
    if json_out:
        sys.stdout.write(json.dumps(summary.as_dict()) + "\n")
        return
    imported = f", {summary.imported_tensors} taken from GGUF blocks as they are" if summary.imported_tensors else ""
    what = summary.preset
    if summary.tensor_types:
        what += " as GGUF: " + ", ".join(f"{n} {t}" for t, n in summary.tensor_types.items())
    sys.stdout.write(
        f"wrote {summary.output} ({what})\n"
        f"  size {_size(summary.source_bytes)} -> {_size(summary.output_bytes)}; "
        f"{summary.bits_per_weight:.2f} bits per weight over {summary.parameters / 1e6:.1f} M parameters\n"
        f"  {summary.quantized_tensors} tensors quantized{imported}; {summary.seconds:.1f} s\n")


def _open(flags, progress=None):
    """The runtime `run` takes with these flags: the torch-free native step where it runs the model,
    else the torch path's."""
    from ..runtime.lean import open_lean
    from ..runtime.runtime import open_model

    return open_lean(flags, progress=progress) or open_model(flags, progress)


def _open_reference(flags, reference: str, progress=None):
    """--reference: a preset (the same MODEL quantized so, e.g. f32: dequantized, full precision) or
    another model, opened as `run` would open it."""
    from ..quant.presets import load_preset, shipped_names
    from ..runtime.runtime import locate

    if reference in shipped_names() or (reference.endswith(".toml") and not locate(reference).is_dir()):
        if flags.dtype == "auto" and load_preset(reference).dtype == "float32":
            flags = flags.with_(dtype="float32")  # (full precision: not the CPU's bfloat16 compute)
        return _open(flags.with_(quant=reference), progress)
    return _open(flags.with_(model=reference, quant=None), progress)


def _step_words(rt) -> str:
    """What computed the logits: the native step's words (as `bench` and `run -v` say them), or the
    torch model's forward."""
    if getattr(rt.loaded.model, "torch_free", False):
        return rt.describe_step(rt.loaded.model)
    return f"torch forward ({rt.placement.dtype}, {rt.loaded.weights_type})".replace("torch.", "")


def perplexity(
    model: ModelArg,
    file: Annotated[Path, typer.Option("--file", "-f", help="The text to score (UTF-8).", show_default=False)],
    ctx_size: Annotated[int, typer.Option("--ctx-size", "-c", help="Window size in tokens (llama-perplexity's -c).")] = 512,
    chunks: Annotated[Optional[int], typer.Option("--chunks", help="Score only the first N windows (default: all).", show_default=False)] = None,
    reference: Annotated[Optional[str], typer.Option("--reference", help="Also compare with this model, or with MODEL under this preset: KL divergence and same top token.", show_default=False)] = None,
    quant: Quant = None,
    device: Device = "auto", dtype: Dtype = "auto", threads: Threads = None,
    json_out: JsonOut = False,
):
    """Perplexity of MODEL over a text, in windows scored on their second half (like llama-perplexity)."""
    from ..bench.perplexity import evaluate
    from ..runtime.runtime import check_ctx_size
    from .startup import opening

    from ..text_input import MAX_DATA_BYTES, read_text_file

    text = read_text_file(file, "--file", MAX_DATA_BYTES)  # a regular UTF-8 file: a FIFO would block
    if chunks is not None and chunks < 1:
        raise InvalidParameterError(f"--chunks must be at least 1, got {chunks}")
    flags = model_flags(model, device=device, dtype=dtype, threads=threads, quant=quant, ctx_size=ctx_size)
    with opening(stderr_console()) as progress:
        rt = _open(flags, progress)
        ctx = check_ctx_size(ctx_size, rt.loaded.args.max_position_embeddings)
        ref = _open_reference(flags, reference, progress) if reference else None
    with _progress_bar("scoring", sys.stderr.isatty()) as update:
        result = evaluate(rt.loaded, text, ctx, chunks, ref.loaded if ref else None,
                          progress=lambda done, total: update(done, total, f"{done}/{total} windows"))
    if json_out:
        out = {"model": rt.loaded.name, "weights": rt.loaded.weights_type, "step": _step_words(rt), "file": str(file),
               **result.as_dict()}
        if ref:
            out["reference"] = {"model": ref.loaded.name, "weights": ref.loaded.weights_type, "step": _step_words(ref)}
        sys.stdout.write(json.dumps(out) + "\n")
        return
    lines = [f"perplexity {result.ppl:.4f} ({rt.loaded.weights_type}) over {result.windows} windows of "
             f"{result.ctx_size} tokens, {result.scored_tokens} scored; {result.seconds:.1f} s",
             f"  step: {_step_words(rt)}"]
    if ref:
        lines.append(f"reference  {result.ppl_reference:.4f} ({ref.loaded.weights_type}); ratio {result.ppl_ratio:.4f}")
        lines.append(f"  step: {_step_words(ref)}")
        lines.append(f"KL divergence mean {result.kld_mean:.5f}, p99 {result.kld_p99:.5f}, max {result.kld_max:.4f}; "
                     f"same top token {100 * result.same_top:.2f} %")
    sys.stdout.write("\n".join(lines) + "\n")
