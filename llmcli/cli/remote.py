"""--api URL for `run`, `chat`, `batch` and `bench`: the flags that only mean something for a model
run here are refused in one line, and the server's model is opened (runtime/remote.py)."""

from __future__ import annotations

from ..errors import InvalidParameterError


def refuse_local(given: dict[str, bool]) -> None:
    """`given`: flag -> whether it was set; any set is refused (the server chose these when it started)."""
    local = [flag for flag, set_ in given.items() if set_]
    if local:
        raise InvalidParameterError(f"{', '.join(local)} {'does' if len(local) == 1 else 'do'} not apply with --api: "
                                    "the server loads and runs the model as it was started; drop "
                                    f"{'it' if len(local) == 1 else 'them'}")


def model_flags_given(quant=None, device="auto", dtype="auto", threads=None, kv_type="auto", kv_offload="auto",
                      registry=None, offline=False, chat_template=None, compile=False,
                      cache_ram=None) -> dict[str, bool]:
    """The local model flags a command got, as refuse_local takes them."""
    return {"--quant": quant is not None, "--device": device != "auto", "--dtype": dtype != "auto",
            "--threads": threads is not None, "--kv-type": kv_type != "auto", "--kv-offload": kv_offload != "auto",
            "--registry": registry is not None, "--offline": bool(offline),
            "--chat-template-file": chat_template is not None, "--compile": bool(compile),
            "--cache-ram": cache_ram is not None}


def open_api(err, url: str, key: str | None, model: str | None, ctx_size: int | None = None, verbose: bool = False):
    """The server's model as a runtime (GET /models, once); -v says where it runs."""
    from ..runtime.remote import open_remote

    rt = open_remote(url, key, model, ctx_size)
    if verbose:
        known = f"context {rt.ctx_size}" if rt.context_known else "context: the server's"
        err.print(f"[dim]{rt.model} at {rt.api.url} ({known}); GET /models took {rt.loaded.load_seconds:.2f} s[/dim]")
    return rt
