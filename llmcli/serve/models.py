"""The models a server answers for, loaded on demand: llama-server's router mode and ollama's way.

One model given to `serve` is served alone (a request naming another is a 404). With none, or with
several, any model the registry or the store can resolve is loaded when a request first names it:

    models = Models(load, on_demand=True, models_max=3, keep_alive=300)
    with models.use("smollm2") as served:   # loads it if needed (one load, however many ask at once)
        ...                                 # served.rt, .loop, .prepare, .embedder
    models.loaded()                         # what is in memory, most recently used first

- At most `models_max` at once: the least recently used idle model is unloaded to make room; when all
  are busy, the request is refused (503) with what is loaded.
- A model whose memory plan does not fit beside the loaded ones unloads idle ones, least recently
  used first, until it fits; when none is left to unload, the plan's own message goes back (503).
- Idle models unload `keep_alive` seconds after their last request (None: never; models given on
  the command line are kept unless --keep-alive is given); a request may set its model's own.
- Requests for a model that is loading wait for it, at most `wait_s` seconds (then 503).
A model is busy while a request holds it (`use`, or `hold`/`release` around an engine run).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .. import heap
from ..errors import LlmcliError, ModelNotFoundError
from ..runtime.plan import NotEnoughMemoryError
from .openai_api import ApiError

IDLE_CHECK_S = 1.0  # how often idle models are looked at for their keep_alive
POLL_S = 0.1  # how often a request waiting for room looks whether a busy model went idle


@dataclass(eq=False)
class Served:
    """One loaded model and what serves it: the runtime, its engine loop (None: embeddings only), its
    request preparer and embedder (None: it does not embed)."""

    name: str  # as the request that loaded it named it (or the command line)
    rt: object
    loop: object
    prepare: object
    embedder: object
    keep_alive: float | None  # seconds idle before it unloads (None: never)
    aliases: set[str] = field(default_factory=set)
    holds: int = 0  # requests that hold it (preparing, or running in its engine)
    last_used: float = field(default_factory=time.monotonic)
    loaded_at: float = field(default_factory=time.time)

    @property
    def busy(self) -> bool:
        return self.holds > 0 or (self.loop is not None and self.loop.in_flight > 0)

    @property
    def expires_at(self) -> float | None:
        """Wall-clock time it unloads if no request comes (None: never)."""
        return None if self.keep_alive is None else time.time() + self.keep_alive - (time.monotonic() - self.last_used)

    def close(self) -> None:
        if self.loop is not None:
            self.loop.close()


class Models:
    def __init__(self, load: Callable[[str], Served], *, on_demand: bool, models_max: int = 3,
                 keep_alive: float | None = 300.0, wait_s: float = 300.0, resolve: Callable[[str], str] | None = None):
        """`load(name)` opens a model and builds what serves it (NotEnoughMemoryError, ModelNotFoundError
        and the other LlmcliErrors: the request's answer); `resolve(name)` says which file a name means
        (two names of one file share a load), default: the name itself."""
        self._load, self.on_demand, self.models_max = load, on_demand, models_max
        self.keep_alive, self.wait_s = keep_alive, wait_s
        self._resolve = resolve or (lambda name: name)
        self._lock = threading.Condition()
        self._served: list[Served] = []  # most recently used first
        self._loading: set[str] = set()  # resolved names being loaded
        self.loads = 0  # models loaded so far (tests: never the same twice at once)
        self._stopping = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="llmcli-models", daemon=True)
        self._reaper.start()

    # ------------------------------------------------------------------ the server's side

    def add(self, served: Served) -> Served:
        """A model loaded by the caller (serve's command line): served as any other."""
        with self._lock:
            self._served.append(served)
            self.loads += 1
        return served

    def loaded(self) -> list[Served]:
        with self._lock:
            return list(self._served)

    @contextlib.contextmanager
    def use(self, name: str | None):
        served = self.hold(name)
        try:
            yield served
        finally:
            self.release(served)

    def hold(self, name: str | None) -> Served:
        """The model `name` names (None or "": the only or most recently used one), loaded if need
        be, held until release()."""
        served = self._find(name)
        if served is None:
            if not self.on_demand:
                raise self._not_served(name)
            served = self._load_held(name)
        return served

    def release(self, served: Served, keep_alive: float | None | str = "same") -> None:
        """A request is done with `served` (its engine requests, if any, were submitted: the loop's
        in_flight counts them now). `keep_alive`: a new idle time for it (ollama's keep_alive)."""
        with self._lock:
            served.holds -= 1
            served.last_used = time.monotonic()
            if keep_alive != "same" and self.on_demand:
                served.keep_alive = keep_alive
            self._lock.notify_all()

    def keep(self, served: Served, keep_alive: float | None) -> None:
        """`served` stays `keep_alive` seconds idle after its last request (None: for good; ollama's
        keep_alive). The one model of a server that loads none on demand stays, whatever is asked."""
        if not self.on_demand:
            return
        with self._lock:
            served.keep_alive = keep_alive

    def unload_named(self, name: str) -> str | None:
        """Unload the model `name` names once it is idle (its requests end first); its name, or None
        where none is loaded under it."""
        with self._lock:
            found = [s for s in self._served if name in (s.name, *s.aliases)]
        for s in found:
            self.keep(s, 0.0)  # (the reaper unloads it when idle, within IDLE_CHECK_S)
        return found[0].name if found else None

    def close(self) -> None:
        self._stopping.set()
        for served in self.loaded():
            served.close()

    # ------------------------------------------------------------------ finding and loading

    def _find(self, name: str | None) -> Served | None:
        with self._lock:
            for s in self._served:
                if name in (None, "") or name == s.name or name in s.aliases:
                    return self._take(s)
        return None

    def _take(self, served: Served) -> Served:
        served.holds += 1
        served.last_used = time.monotonic()
        self._served.remove(served)
        self._served.insert(0, served)
        return served

    def _load_held(self, name: str) -> Served:
        try:
            key = self._resolve(name)
        except LlmcliError as e:
            raise ApiError(404, f"the model {name!r} cannot be served: {e}", "model", "model_not_found") from None
        deadline = time.monotonic() + self.wait_s
        with self._lock:
            while True:
                if key not in self._loading:  # (else another request loads it: wait for that load)
                    for s in self._served:
                        if key in s.aliases:
                            s.aliases.add(name)
                            return self._take(s)
                    if self._room_made():
                        break
                if time.monotonic() >= deadline:
                    raise self._still_busy(name, key)
                # (woken by a release or a load's end; a request ending in an engine wakes no one: look again soon)
                self._lock.wait(min(POLL_S, max(0.0, deadline - time.monotonic())))
            self._loading.add(key)
        try:
            served = self._load_fitting(name)
        finally:
            with self._lock:
                self._loading.discard(key)
                self._lock.notify_all()
        served.aliases |= {name, key}
        served.holds += 1
        with self._lock:
            self._served.insert(0, served)
            self.loads += 1
        return served

    def _load_fitting(self, name: str) -> Served:
        """load(name); while its memory plan does not fit, unload an idle model and try again."""
        while True:
            try:
                return self._load(name)
            except ModelNotFoundError as e:
                raise ApiError(404, str(e), "model", "model_not_found") from None
            except NotEnoughMemoryError as e:
                if not self._unload_one(name):
                    loaded = ", ".join(s.name for s in self.loaded()) or "none"
                    raise ApiError(503, f"{e} (loaded and busy: {loaded})", "model", "not_enough_memory") from None
            except LlmcliError as e:
                raise ApiError(400, f"the model {name!r} cannot be served: {e}", "model") from None

    def _room_made(self) -> bool:
        """Whether one more model may load now (with the lock held): under models_max with those
        loading, after unloading the least recently used idle model if need be."""
        while len(self._served) + len(self._loading) >= self.models_max:
            idle = [s for s in reversed(self._served) if not s.busy]
            if not idle:
                return False  # (the caller waits for one to go idle)
            self._served.remove(idle[0])
            threading.Thread(target=self._close, args=(idle[0],), daemon=True).start()
        return True

    def _still_busy(self, name: str, key: str) -> ApiError:
        if key in self._loading:
            return ApiError(503, f"the model {name!r} is still loading after {self.wait_s:g} s; retry later",
                            "model", "model_loading")
        busy = ", ".join(s.name for s in self._served)
        return ApiError(503, f"cannot load {name!r}: the models loaded ({busy}) stayed busy for {self.wait_s:g} s, and "
                             f"--models-max allows {self.models_max} at once; retry later", "model", "models_busy")

    def _unload_one(self, name: str) -> bool:
        with self._lock:
            idle = [s for s in reversed(self._served) if not s.busy]
            if not idle:
                return False
            self._served.remove(idle[0])
        self._close(idle[0])
        return True

    @staticmethod
    def _close(served: Served) -> None:
        served.close()
        heap.trim()

    def _not_served(self, name: str) -> ApiError:
        served = ", ".join(repr(s.name) for s in self.loaded())
        return ApiError(404, f"the model {name!r} is not served here; this server serves {served} (see GET /v1/models)",
                        "model", "model_not_found")

    def _reap(self) -> None:
        """Unload models idle past their keep_alive."""
        while not self._stopping.wait(IDLE_CHECK_S):
            now = time.monotonic()
            with self._lock:
                gone = [s for s in self._served if s.keep_alive is not None and not s.busy
                        and now - s.last_used >= s.keep_alive]
                for s in gone:
                    self._served.remove(s)
            for s in gone:
                self._close(s)
