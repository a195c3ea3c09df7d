"""The Hugging Face Hub source, through huggingface_hub and its shared cache.

Files land in the usual Hugging Face cache (`HF_HOME`/`HF_HUB_CACHE`), so models that other tools
downloaded are reused and the other way round. huggingface_hub handles tokens (`HF_TOKEN` or a prior
`hf auth login`), `HF_ENDPOINT`, locking of each file and resuming a transfer that breaks off.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import threading
from pathlib import Path

from ...errors import (CorruptModelError, DiskFullError, DownloadError, LlmcliError, ModelNotFoundError, NotCachedError,
                       UnsupportedModelError)
from ..registry import Source
from ..store import ProgressFn, sha256_file

# what a transformers-style model folder needs; pickled *.bin weights are never fetched
DEFAULT_FILES = ("config.json", "generation_config.json", "model*.safetensors", "model.safetensors.index.json",
                 "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                 "chat_template.jinja")


def patterns(source: Source) -> list[str]:
    return list(source.files or DEFAULT_FILES)


def offline_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def cached(source: Source, *, cache_dir: str | Path | None = None) -> Path | None:
    """The model's path if the cache already holds every file it needs, without touching the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(source.repo, revision=source.revision, allow_patterns=patterns(source),
                                   cache_dir=cache_dir, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    return pick(Path(folder), source)


def fetch(source: Source, *, offline: bool = False, progress: ProgressFn | None = None,
          cache_dir: str | Path | None = None, endpoint: str | None = None) -> Path:
    """Download what the cache lacks (or, offline, insist on the cache) and return the model's path."""
    from huggingface_hub import snapshot_download

    if offline or offline_env():
        path = cached(source, cache_dir=cache_dir)
        if path is None:
            raise NotCachedError(f"{source} is not in the Hugging Face cache and --offline (or HF_HUB_OFFLINE) uses "
                                 "only the cache; pull it with network access first")
        return path
    _with_timeouts()
    try:
        folder = snapshot_download(source.repo, revision=source.revision, allow_patterns=patterns(source),
                                   cache_dir=cache_dir, endpoint=endpoint, tqdm_class=_bars(progress, str(source)))
    except Exception as e:
        raise _explain(e, source, endpoint) from e
    path = pick(Path(folder), source)
    if path is None:
        raise ModelNotFoundError(f"{source} has no files matching {', '.join(patterns(source))}; a GGUF repo needs "
                                 "a quantization, e.g. org/name:Q4_K_M")
    _check_sha256(Path(folder), source, cache_dir)
    return path


CONNECT_SECONDS = 10.0  # huggingface_hub's own default for its file downloads (HF_HUB_DOWNLOAD_TIMEOUT)
_timeouts_set = False


def _with_timeouts() -> None:
    """Connect and read timeouts on every request huggingface_hub makes. Its shared client has
    none, and snapshot_download's first call (repo_info) passes none either, so a host that accepts
    the connection and never answers held `pull` for 200 s and more. Requests that name their own
    timeout (file downloads: HF_HUB_DOWNLOAD_TIMEOUT) keep it."""
    global _timeouts_set
    if _timeouts_set:
        return
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    read = float(constants.HF_HUB_DOWNLOAD_TIMEOUT or CONNECT_SECONDS)
    if hasattr(_http, "default_client_factory"):  # huggingface_hub >= 1.0: httpx
        def fill(request):
            given = request.extensions.get("timeout") or {}
            request.extensions["timeout"] = {"connect": given.get("connect") or CONNECT_SECONDS,
                                             "read": given.get("read") or read, "write": given.get("write") or read,
                                             "pool": given.get("pool") or CONNECT_SECONDS}

        def client():
            made = _http.default_client_factory()
            made.event_hooks = {**made.event_hooks, "request": [*made.event_hooks.get("request", []), fill]}
            return made
        _http.set_client_factory(client)
    elif hasattr(_http, "_default_backend_factory"):  # 0.x: requests
        def session():
            made = _http._default_backend_factory()
            send = made.request
            made.request = lambda *a, timeout=None, **k: send(*a, timeout=timeout or (CONNECT_SECONDS, read), **k)
            return made
        _http.configure_http_backend(session)
    _timeouts_set = True


def pick(folder: Path, source: Source) -> Path | None:
    """The snapshot folder, or the one GGUF file in it the patterns select; None if files are missing."""
    wanted = patterns(source)
    names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    matched = [n for n in names if any(fnmatch.fnmatch(n, pat) for pat in wanted)]
    literal = [pat for pat in source.files if not any(c in pat for c in "*?[")]
    if not matched or any(pat not in matched for pat in literal):
        return None
    if not source.files and not any(n.endswith(".safetensors") for n in matched):
        return None  # config files without weights: a partial download
    ggufs = [n for n in matched if n.endswith(".gguf")]
    if len(ggufs) > 1:
        raise UnsupportedModelError(f"{source} matches several GGUF files ({', '.join(sorted(ggufs)[:4])}); "
                                    "name one: org/name:FILE.gguf")
    return folder / ggufs[0] if ggufs else folder


def _check_sha256(folder: Path, source: Source, cache_dir) -> None:
    for name, expected in source.sha256:
        got = sha256_file(folder / name)
        if got != expected:
            _drop_revision(folder.name, cache_dir)
            raise CorruptModelError(f"{name} from {source} has sha256 {got[:16]}..., expected {expected[:16]}...; "
                                    "refused and removed from the Hugging Face cache")


def _drop_revision(commit: str, cache_dir) -> None:
    from huggingface_hub import scan_cache_dir

    scan_cache_dir(cache_dir).delete_revisions(commit).execute()


def _explain(e: Exception, source: Source, endpoint: str | None) -> LlmcliError:
    """A huggingface_hub / network exception -> one line that says what to do."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    login = "log in with `hf auth login` or set HF_TOKEN"
    hub = endpoint or constants.ENDPOINT
    if isinstance(e, GatedRepoError):
        return DownloadError(f"{source.repo} is gated: accept its terms on {hub}/{source.repo}, then {login}")
    if isinstance(e, RepositoryNotFoundError):
        return ModelNotFoundError(f"there is no model {source.repo} on the Hugging Face Hub ({hub}); check the name "
                                  f"(if it is private, {login})")
    if isinstance(e, RevisionNotFoundError):
        return ModelNotFoundError(f"{source.repo} has no revision {source.revision!r}; use a branch, tag or commit "
                                  "that exists")
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"the disk is full: {source} did not fit in the Hugging Face cache (the partial file was "
                             "removed); free some space or set HF_HOME to a bigger disk")
    if isinstance(e, LocalEntryNotFoundError):  # the Hub could not be reached and the cache lacks the files
        cause = e.__cause__ or e.__context__
        why = f" ({type(cause).__name__})" if cause is not None else ""
        if "Timeout" in type(cause).__name__:
            return DownloadError(f"the Hugging Face Hub at {hub} did not answer in time{why} and {source} is not in "
                                 "the cache; check the network and try again, or use --offline to run only models "
                                 "already downloaded (`llmcli list`)")
        return DownloadError(f"cannot reach the Hugging Face Hub at {hub}{why} and {source} is not in the cache; "
                             "check the network and try again (--offline uses only the cache)")
    if isinstance(e, HfHubHTTPError):
        status = getattr(e.response, "status_code", "?")
        if status in (401, 403):
            return DownloadError(f"the Hub refused access to {source.repo} ({status}); {login} with a token that "
                                 "can read it")
        return DownloadError(f"the Hugging Face Hub answered {status} for {source}; try again later")
    network = ("httpx", "httpx2", "httpcore", "requests", "urllib3")
    if type(e).__module__.split(".")[0] in network or isinstance(e, OSError):
        return DownloadError(f"downloading {source} failed ({type(e).__name__}: {str(e)[:120]}); try again — "
                             "finished files are kept")
    raise e


def _bars(progress: ProgressFn | None, label: str):
    """A tqdm stand-in for snapshot_download that reports bytes written to `progress`, and prints nothing.

    snapshot_download makes three bars: files done, bytes received, bytes written. Only the last one
    has the right total (it grows as each file starts), so only it is reported.
    """
    lock = threading.Lock()

    class Bar:
        def __init__(self, *args, **kwargs):
            desc = kwargs.get("desc") or ""
            self._reports = progress is not None and kwargs.get("unit") == "B" and not desc.startswith("Downloading")
            self.n = kwargs.get("initial") or 0
            self._total = kwargs.get("total") or None
            self.format_dict = {"rate": None}

        @property
        def total(self):
            return self._total

        @total.setter
        def total(self, value):
            self._total = value or None
            self._report()

        def update(self, n=1):
            with lock:
                self.n += n or 0
            self._report()

        def _report(self):
            if self._reports:
                progress(label, self.n, self._total)

        def refresh(self, *args, **kwargs):
            self._report()

        def close(self):
            pass

        def set_description(self, *args, **kwargs):
            pass

        set_description_str = set_postfix_str = set_description

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    return Bar
