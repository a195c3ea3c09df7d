"""The C++ decode step (native_step.py, native/src/step.cpp) against the model's own forward pass, on
tiny GGUF files of the types and layouts real ones have: Q4_1/Q8_0 llama (SmolLM2's), a qwen2
Q4_K_M and Q5_K_M mix (q/k/v biases, unfused q/k/v of different types, 32-block fallbacks, Q5_K
on the float route), qwen3 (q/k norm), gemma3 (four norms of 1 + w, GELU, local layers with their
own RoPE table and window), phi3 (fused q/k/v and gate/up, LongRoPE, half the head turned), F16
llama and BF16 gemma3 (float32 activations: float tolerances); and a sliding window, a context
shift's positions, hidden states."""

from __future__ import annotations

import pytest
import torch

from llmcli import native
from llmcli.native.build import VARIANTS
from llmcli.runtime import native_step

# the portable kernels alone (no AVX2): Q4_0/Q4_1/Q8_0/Q4_K load for torch's kernels, and no step takes them
pytestmark = pytest.mark.skipif(not native.int8_dot(), reason="no C++ compiler for the kernels, or only the portable ones")


def _tiny(model_type: str):
    from tiny import hf_model

    # rows of 256 take K-quants; the MLP's down projection (rows of 320) falls back to 32-blocks
    extra = {"rope_parameters": PHI3_LONGROPE, "original_max_position_embeddings": 32} if model_type == "phi3" else {}
    return hf_model(model_type, hidden_size=256, intermediate_size=320, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, tie_word_embeddings=True, seed=3, **extra)


CASES = {  # name: (architecture, GGUF type of every 2-D weight, or a llama.cpp mix)
    "llama-q4_1": ("llama", lambda name, shape: "Q8_0" if "embed" in name else "Q4_1"),
    "llama-q4_0": ("llama", "Q4_0"),
    "qwen2-q4_k_m": ("qwen2", "Q4_K"),
    "qwen2-q5_k_m": ("qwen2", "Q5_K"),
    "qwen3-q8_0": ("qwen3", "Q8_0"),
    "gemma3-q4_k_m": ("gemma3_text", "Q4_K"),
    "llama-f16": ("llama", "F16"),  # (a tied F16 embedding: the step looks its rows up too)
    "gemma3-bf16": ("gemma3_text", "BF16"),
    "phi3-longrope-q8_0": ("phi3", "Q8_0"),  # fused qkv and gate_up, half the head turned, LongRoPE's long set
}
PHI3_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                 "original_max_position_embeddings": 32, "short_factor": [1.0 + 0.25 * i for i in range(16)],
                 "long_factor": [2.0 + i for i in range(16)]}


def write_case(name: str, folder):
    """CASES[name]'s tiny model written as a GGUF into `folder` (test_lean.py's files too)."""
    from tiny import k_mix, write_gguf

    arch, qtype = CASES[name]
    if qtype in ("Q4_K", "Q5_K"):
        qtype = k_mix(3, tied=True, base=qtype)
    path = folder / f"{name}.gguf"
    write_gguf(_tiny(arch), path, qtype)
    return path


@pytest.fixture(scope="module", params=list(CASES))
def loaded(request, tmp_path_factory):
    from llmcli.runtime.runtime import open_model

    path = write_case(request.param, tmp_path_factory.mktemp("native"))
    rt = _open_int8(path)
    assert rt.placement.dtype == torch.float32  # auto picks it on every CPU where the step runs
    assert rt.kv_type == "f16" and rt.new_cache().k[0].dtype == torch.float16  # and a float16 cache
    return rt


def _open_int8(path, activations: str = "int8"):
    """The file with default flags (as stored, float32 for the step), its activations int8 (llama.cpp's:
    _compare's premise) where a tiny file's default is int8x2 (quant/precision.py)."""
    import os

    from llmcli.quant.precision import ENV
    from llmcli.runtime.runtime import open_model

    before = os.environ.get(ENV)
    os.environ[ENV] = activations
    try:
        return open_model(str(path), device="cpu", ctx_size=64)
    finally:
        os.environ.pop(ENV) if before is None else os.environ.__setitem__(ENV, before)


@pytest.fixture(params=list(VARIANTS))
def variant(request, monkeypatch):
    """The step on each kernel variant this CPU runs (the others skip, naming the missing flag)."""
    reason = native.why_not(request.param)
    if reason is not None:
        pytest.skip(reason)
    monkeypatch.setattr(native, "_module", native.load(request.param))
    return request.param


def _compare(rt, positions: int | None = None, flip: float = 0.1):
    """Prefill with the model, then one-token steps, each run twice from the same cache: by the C++
    step and by the model. Compared: logits, final hidden state, and the keys and values written.

    Both sides quantize activations to int8 per block of 32. Where float32 rounding differs (an exp,
    a fused multiply-add), a value now and then lands across a rounding boundary, and that one code
    moves the result by a few percent of its scale. So: most steps agree to float32 rounding, none by
    more than such a flip; a wrong rotation, bias, window or cache write breaks every step. F16 and
    BF16 rows take the activations as floats: there every step agrees to float32 rounding."""
    import copy

    from llmcli.cache import new_cache
    from llmcli.runtime.native_step import NativeStep

    assert isinstance(rt.decode_step(compile=False), NativeStep)
    model = rt.loaded.model
    step = NativeStep(model, threads=3)  # more threads than CPUs here: uneven shares, threads that wait
    # float32, where run's default is float16: the model's update() keeps the new tokens as computed
    cache = new_cache(rt.loaded.args, rt.ctx_size, torch.device("cpu"), torch.float32)
    exact, worst = 0, 0.0
    with torch.inference_mode():
        model(torch.tensor([[5, 17, 80, 3, 200, 41, 9, 150]]), cache)
        for tok in [7, 99, 250, 31, 2, 64, 120, 8]:
            theirs = copy.deepcopy(cache)
            pos = None if positions is None else torch.tensor([positions + cache.length])
            got = step(torch.tensor([[tok]]), cache, pos, True, True)
            want = model(torch.tensor([[tok]]), theirs, pos, True, True)
            assert cache.length == theirs.length
            slot = cache.length - 1
            errors = [_relative(g, w) for g, w in zip(got, want)]
            errors += [_relative(g[:, :, slot], w[:, :, slot]) for g, w in zip(cache.k + cache.v, theirs.k + theirs.v)]
            exact += max(errors) < 1e-5
            worst = max(worst, *errors)
    if _float_rows(model):
        assert worst < 1e-5, worst
    assert exact >= (5 if flip >= 0.1 else 0) and worst < flip, (exact, worst)


def _float_rows(model) -> bool:
    """Whether every matrix of the model is F16/BF16 rows (float32 activations, no int8 codes)."""
    from llmcli.quant.gguf_blocks import FLOAT_ROWS

    kinds = {m.packed.type_name for m in model.modules() if hasattr(m, "packed")}
    return bool(kinds) and kinds <= set(FLOAT_ROWS)


def _relative(got, want) -> float:
    return (got - want).abs().max().item() / want.abs().max().item()


@pytest.fixture(autouse=True)
def norms_summed_in_float64(monkeypatch):
    """The model's RMSNorm summing squares in float64 as the C++ step does: with the sums in another
    order, nearly every step had a flip (_compare) somewhere."""
    from llmcli.models import gemma3, llama

    def forward(self, x):
        xf = x.float()
        r = 1.0 / torch.sqrt((xf.double() ** 2).mean(-1, keepdim=True).float() + self.eps)
        return self.weight * (xf * r).to(x.dtype)

    def gemma_forward(self, x):
        xf = x.float()
        r = 1.0 / torch.sqrt((xf.double() ** 2).mean(-1, keepdim=True).float() + self.eps)
        return ((1.0 + self.weight.float()) * (xf * r)).to(x.dtype)

    monkeypatch.setattr(llama.RMSNorm, "forward", forward)
    monkeypatch.setattr(gemma3.RMSNorm, "forward", gemma_forward)


def test_native_steps_give_the_model_s_logits_and_cache(loaded, variant):
    _compare(loaded)


@pytest.fixture(scope="module", params=["llama-q4_1", "qwen2-q4_k_m", "gemma3-q4_k_m"])
def loaded_int8x2(request, tmp_path_factory):
    return _open_int8(write_case(request.param, tmp_path_factory.mktemp("native")), "int8x2")


def test_int8x2_steps_stay_near_the_model(loaded_int8x2, variant):
    """int8x2 activations (a small file's default): a float32 rounding difference flips a residual's
    code on most steps, but such a flip moves a value by ~1/254 of an int8 flip's."""
    _compare(loaded_int8x2, flip=2e-3)


def test_native_steps_follow_a_context_shift_s_positions(loaded, variant):
    """After a shift the RoPE position runs ahead of the cache slot."""
    _compare(loaded, positions=5)


def test_native_steps_keep_a_sliding_window(loaded, variant, monkeypatch):
    for layer in loaded.loaded.model.model.layers[1:]:
        monkeypatch.setattr(layer.self_attn, "window", 4)
    _compare(loaded)


def test_a_float16_cache_holds_the_float32_values_rounded_and_gives_nearly_the_same_logits(loaded, variant):
    """--kv-type f16 through the step: the first layer's keys and values (computed before any
    attention) are the float32 cache's rounded to nearest even, bit for bit; the logits stay near the
    float32 cache's (float16's rounding, ~5e-4 of a value, moves an int8 code of the next projection's
    input across a boundary now and then, as in _compare: a few percent of the largest logit on this
    random model, where a wrong offset or stride is of its order); and tokens in one call equal
    tokens one at a time, as with float32."""
    from llmcli.cache import new_cache
    from llmcli.runtime.native_step import NativeStep

    args = loaded.loaded.args
    step = NativeStep(loaded.loaded.model, threads=2)
    c32, c16, many = (new_cache(args, 64, torch.device("cpu"), torch.float32, kv) for kv in (None, "f16", "f16"))
    assert c16.k[0].dtype == torch.float16 and NativeStep.fits(c16)
    ids = [5, 17, 80, 3, 200, 41, 9, 150, 7, 99]
    with torch.inference_mode():
        l32 = torch.cat([step(torch.tensor([[t]]), c32, last_only=True) for t in ids], 1)
        l16 = torch.cat([step(torch.tensor([[t]]), c16, last_only=True) for t in ids], 1)
        together = step(torch.tensor([ids]), many)
    n = len(ids)
    for a, b in ((c16.k[0], c32.k[0]), (c16.v[0], c32.v[0])):
        assert torch.equal(a[:, :, :n], b[:, :, :n].to(torch.float16))
    errors = [_relative(l16[0, i], l32[0, i]) for i in range(n)]  # 0.02-0.03 here: every token has a flip or two
    assert max(errors) < 0.1 and sum(errors) / n < 0.05, errors
    if _float_rows(loaded.loaded.model):  # float activations: only float16's rounding of the cache
        assert max(errors) < 5e-3, errors
    assert torch.equal(together, l16)
    assert all(torch.equal(a[:, :, :n], b[:, :, :n]) for a, b in zip(c16.k + c16.v, many.k + many.v))
    assert c16.out is not None and c16.nbytes > many.nbytes  # the conversion buffers only once the model asks


def test_what_the_native_step_does_not_cover_runs_the_model(loaded):
    from llmcli.cache import StaticKVCache, new_cache

    step = loaded.decode_step(compile=False)
    args = loaded.loaded.args
    with torch.inference_mode():
        for cache in (StaticKVCache.for_model(args, 16, torch.device("cpu"), torch.bfloat16,
                                              compute_dtype=torch.float32),
                      new_cache(args, 16, torch.device("cpu"), torch.float32, "int8", None)):
            two = step(torch.tensor([[5, 6]]), cache)  # two tokens: the model's prefill
            one = step(torch.tensor([[7]]), cache, last_only=True)  # another cache kind: the model too
            assert two.shape[:2] == (1, 2) and one.shape[:2] == (1, 1) and cache.length == 3
            assert step._cache is None  # the C++ step never saw these caches


def test_no_native_step_without_a_float32_cache_or_the_kernels(loaded, monkeypatch):
    from llmcli.cache.static import StaticKVCache
    from llmcli.runtime.native_step import NativeStep

    assert NativeStep.supports(loaded.loaded.model)
    assert not NativeStep.fits(StaticKVCache.for_model(loaded.loaded.args, 4, torch.device("cpu"), torch.bfloat16))
    monkeypatch.setenv("LLMCLI_NO_KERNEL", "1")
    monkeypatch.setattr(native, "_module", None)
    assert not isinstance(loaded.decode_step(compile=False), NativeStep)


def test_several_tokens_a_call_give_what_one_at_a_time_gives(loaded):
    """A prefill's or a speculative pass's tokens in one call: each token's logits, hidden state and
    cache rows are exactly those of one-token calls (its activations quantize alone, its products
    take the one-row kernels' order)."""
    step = loaded.decode_step(compile=False)
    ids = [5, 17, 80, 3, 200, 41, 9, 150, 7, 99, 250, 31, 2]
    one, many = loaded.new_cache(), loaded.new_cache()
    with torch.inference_mode():
        alone = [step(torch.tensor([[t]]), one, hidden=True) for t in ids]
        logits, hidden = step(torch.tensor([ids]), many, hidden=True)
    assert many.length == one.length == len(ids)
    assert torch.equal(logits[0], torch.cat([a[0][0] for a in alone]))
    assert torch.equal(hidden[0], torch.cat([a[1][0] for a in alone]))
    assert all(torch.equal(a[..., :len(ids), :], b[..., :len(ids), :]) for a, b in zip(one.k + one.v, many.k + many.v))


def test_phi3_s_step_turns_by_the_factors_its_cache_size_picks(loaded):
    """LongRoPE's short factors while a cache fits the original context (32 here), the long ones past
    it: one step, used on a short cache, then a long one, then a short one again, gives the model's
    logits on each (its RoPE tables are made again when the factors change)."""
    import copy

    from llmcli.cache import new_cache
    from llmcli.runtime.native_step import NativeStep

    model = loaded.loaded.model
    if loaded.loaded.args.model_type != "phi3":
        pytest.skip("LongRoPE is phi3's")
    step = NativeStep(model)
    prompt = torch.tensor([[5, 17, 80, 3, 200, 41]])
    for size in (32, 64, 32):
        cache = new_cache(loaded.loaded.args, size, torch.device("cpu"), torch.float32)
        with torch.inference_mode():
            model(prompt, cache)
            theirs = copy.deepcopy(cache)
            got, want = step(torch.tensor([[7]]), cache), model(torch.tensor([[7]]), theirs)
        assert _relative(got, want) < 0.1, size
    short, long = model.inv_freq_for(32), model.inv_freq_for(64)
    assert not torch.equal(short, long) and step._tables_of is short


def test_the_weights_copies_are_made_once_and_read_by_every_step(loaded):
    """The interleaved copies of the weights are made before the first step (the runtime makes them
    at load; a NativeStep for a model without them, at its construction) and held by the weights: a
    batch engine made after the last one is gone (a benchmark's pass, a second `batch`) reads the
    same copies, and decodes what the first one did."""
    import gc

    model = loaded.loaded.model
    packed = [m.packed for group in native_step._groups(model) for m in group]
    outs, copies = [], []
    for _ in range(2):
        engine = loaded.batch_engine(2, 32)
        copies.append([None if p.interleaved is None else p.interleaved.data_ptr() for p in packed])
        with torch.inference_mode():
            logits = engine.step_fn(torch.tensor([[5], [17]]), engine.cache, slots=torch.tensor([0, 0]), last_only=True)
        outs.append(logits)
        del engine
        gc.collect()
    assert copies[0] == copies[1] and torch.equal(outs[0], outs[1])
    takes = [native.module().grouped_takes(native_step.TYPE_IDS[p.type_name], p.shape[0]) for p in packed]
    if _float_rows(model):  # F16/BF16 rows are read as stored: no copy at all
        assert not any(copies[0])
    else:  # kernels with row groups (x86's) read copies of the weights they take, the others as stored
        assert all(t for c, t in zip(copies[0], takes) if c is not None) and any(copies[0]) == any(takes)


def _mapping(address: int) -> tuple[int, int, int]:
    """(start, end, resident bytes) of this process's mapping holding `address` (/proc/self/smaps)."""
    found = None
    for line in open("/proc/self/smaps").read().splitlines():
        head = line.split()
        if "-" in head[0] and ":" not in head[0]:
            start, end = (int(x, 16) for x in head[0].split("-"))
            found = (start, end) if start <= address < end else None
        elif found is not None and head[0] == "Rss:":
            return (*found, int(head[1]) * 1024)
    raise AssertionError("not mapped")


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_a_gguf_s_weights_are_in_memory_once(loaded):
    """Loaded for the native step, every weight copied for the row-group kernels was copied from the
    file's blocks in the memory map (Q/K rows in llama.cpp's order included: the copy takes them in HF
    order), and the file's pages under it are released; so are those of a weight read as stored whose
    rows had to be un-permuted. The map holds at most what the other weights and the header need."""
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(loaded.loaded.path), device="cpu", ctx_size=64)  # fresh: nothing run eagerly
    model = rt.loaded.model
    start, end, resident = _mapping(model.model.embed_tokens.packed.stored.data_ptr())
    packed = {id(m.packed): m.packed for group in native_step._groups(model) for m in group}.values()
    in_map = {id(p) for p in packed if start <= p.stored.data_ptr() < end}
    copied = [p for p in packed if p.interleaved is not None]
    assert all(id(p) in in_map for p in copied)
    assert bool(copied) == (bool(native.module().group_rows) and not _float_rows(model))
    released = sum(p.stored.numel() for p in copied) + sum(p.nbytes for p in packed if id(p) not in in_map)
    # a tied head's released pages come back as the step looks token rows up in them
    embedding = model.model.embed_tokens.packed
    looked_up = embedding.nbytes if any(p is embedding for p in copied) else 0
    page = 4096
    assert resident <= (end - start) - released + looked_up + 2 * page * len(packed), (resident, end - start, released)


def test_a_session_s_first_step_makes_nothing_the_load_did_not(loaded, monkeypatch):
    """The runtime warms the step up at load: a step made afterwards for a new cache (a `run`, a chat
    session) finds the weights' copies and the RoPE tables made, and its first call makes neither."""
    from llmcli.quant.gguf_blocks import GGUFBlockWeight

    model = loaded.loaded.model
    if model.args.model_type == "phi3":  # (its tables depend on the cache's size: made for each)
        pytest.skip("LongRoPE's tables are the cache's")
    assert model in native_step._TABLES
    step = loaded.decode_step(compile=False)
    monkeypatch.setattr(native_step.NativeStep, "_cos_sin", lambda *a: pytest.fail("tables made again"))
    monkeypatch.setattr(GGUFBlockWeight, "interleave", lambda *a: pytest.fail("weights copied again"))
    with torch.inference_mode():
        step(torch.tensor([[5, 17, 80]]), loaded.new_cache(), last_only=True)


def test_the_step_looks_up_embeddings_and_rope_rows_as_the_model_gives_them(loaded):
    """Token ids go to the C++ step, which takes their rows of the embedding table (GGUF blocks,
    Gemma's normalizer applied) and of the RoPE tables itself: bit for bit what the model's embed and
    the tables' rows as tensors give (the step without its own tables; its first call makes them)."""
    step = loaded.decode_step(compile=False)
    ids = [5, 17, 80, 3, 200, 41, 9, 150, 7, 99, 250, 31, 2]
    with torch.inference_mode():
        cache = loaded.new_cache()
        step(torch.tensor([ids[:1]]), cache, hidden=True)
        assert step._native.embedding is not None and step._native.table_len >= 1
        lean = [step(torch.tensor([[t]]), cache, hidden=True) for t in ids]
        step._native.embedding = None  # (the model's embed and _rope's rows as tensors)
        cache = loaded.new_cache()
        step(torch.tensor([ids[:1]]), cache, hidden=True)
        tensors = [step(torch.tensor([[t]]), cache, hidden=True) for t in ids]
    for (a, ha), (b, hb) in zip(lean, tensors):
        assert torch.equal(a, b) and torch.equal(ha, hb)
    with pytest.raises(ValueError, match="token id"):
        step._build(cache).run_ids(torch.tensor([10 ** 6]), torch.tensor([0]), torch.tensor([0]), torch.tensor([0]))


def test_pieces_give_each_rows_last_token_what_it_gets_alone(loaded, variant):
    """Several rows' tokens in one call (a batch step with new prompts in it): the logits are of the
    pieces' last tokens, which start mid-way through the activations' groups of 8 (row 15 of 20 here,
    then 16..19): each is bit for bit what the row's tokens give in a call of their own. The largest
    logits the step finds as the head makes them (top=k, each thread's chunks merged) are
    native.top_k's of each row's logits, in both calls."""
    from llmcli import native
    from llmcli.cache import new_cache
    from llmcli.runtime.native_step import NativeStep

    step = NativeStep(loaded.loaded.model, threads=3)  # (threads that share the head's chunks, whatever the CPU)
    capped = bool(getattr(loaded.loaded.args, "final_logit_softcapping", None))
    g = torch.Generator().manual_seed(5)
    pieces = [(row, 0, torch.randint(3, 250, (n,), generator=g).tolist()) for row, n in enumerate([6, 3, 5, 2, 4])]
    args = loaded.loaded.args
    # as long as the single rows' caches: phi3's RoPE factors follow the cache size
    batch = new_cache(args, loaded.ctx_size, torch.device("cpu"), torch.float32, "f16", batch=len(pieces))
    batch.length = 6

    def check_top(logits, k):
        if capped:  # (capping can make ties of unequal logits: the step finds none)
            assert step.last_top is None
            return
        values, indices = step.last_top
        assert values.shape == indices.shape == (logits.shape[0], k)
        for row, v, i in zip(logits, values, indices):
            want = native.top_k(row, k)
            assert torch.equal(v, want[0]) and torch.equal(i, want[1])

    with torch.inference_mode():
        logits, hidden = step.pieces(pieces, batch, top=40)
        check_top(logits, 40)
        for i, (_, _, ids) in enumerate(pieces):
            alone_logits, alone_hidden = step(torch.tensor([ids]), loaded.new_cache(), last_only=True, hidden=True, top=8)
            assert torch.equal(logits[i], alone_logits[0, -1]), i
            assert torch.equal(hidden[i], alone_hidden[0, -1]), i
            check_top(alone_logits[0], 8)
        step(torch.tensor([pieces[0][2]]), loaded.new_cache(), last_only=True)
        assert step.last_top is None  # (not asked for)


@pytest.mark.parametrize("joined", [256, 8, 0], ids=["prompts-in-steps", "long-prompts-alone", "prompts-alone"])
def test_a_batch_through_the_native_step_decodes_each_row_as_run_does(loaded, joined, monkeypatch):
    """`batch` and `serve` rows share each weight read (one C++ call a step), new prompts going into
    the running rows' step (up to `joined` tokens a step, else prefilled alone), and every greedy
    sequence is token for token what `run` (generate() through the same step) makes of it alone."""
    from llmcli.decode import batched
    from llmcli.decode.batched import Sequence
    from llmcli.decode.generate import generate
    from llmcli.decode.request import Request
    from llmcli.decode.sampling import SamplingParams
    from llmcli.runtime.native_step import NativeStep

    monkeypatch.setattr(batched, "JOINED_TOKENS", joined)
    g = torch.Generator().manual_seed(2)
    greedy = Request(SamplingParams(temperature=0))
    reqs = [Sequence(torch.randint(3, 250, (int(n),), generator=g).tolist(), greedy.with_(max_tokens=int(m)), tag=i)
            for i, (n, m) in enumerate([(3, 20), (11, 9), (6, 25), (20, 14), (2, 30), (9, 17)])]
    engine = loaded.batch_engine(4, 64, prompt_cache=0)
    assert isinstance(engine.step_fn, NativeStep)
    calls = {"pieces": 0}
    pieces = engine.step_fn.pieces
    monkeypatch.setattr(engine.step_fn, "pieces", lambda *a, **k: calls.__setitem__("pieces", calls["pieces"] + 1) or pieces(*a, **k))
    got: dict = {}
    for req, chunk in engine.run(reqs):
        got.setdefault(req.tag, []).extend(chunk.tokens)
    assert engine.row_steps / engine.steps > 2  # rows were decoded together
    # every prompt joined a step, some did (the short ones), or none
    assert calls["pieces"] >= (2 if joined == 256 else 1) if joined else calls["pieces"] == 0
    step = loaded.decode_step(compile=False)
    for r in reqs:
        alone = generate(loaded.loaded.model, loaded.loaded.tokenizer, r.prompt, r.request.with_(ignore_eos=True),
                         loaded.new_cache(), step)
        assert got[r.tag] == [t for c in alone for t in c.tokens][:len(got[r.tag])], f"request {r.tag}"
        assert len(got[r.tag]) == r.request.max_tokens or got[r.tag][-1] in loaded.loaded.tokenizer.eos_ids


def test_a_step_s_numbers_do_not_depend_on_how_many_threads_run_it(loaded, variant):
    """Decode steps on a team of 3 threads, which tries 2 (and may keep them: more threads than this
    machine's CPUs) every so many steps (thread_choice.h), give the logits of steps on one thread,
    bit for bit, over enough steps for several tries: each row is computed by one thread, whatever
    the others do."""
    from llmcli.cache import new_cache
    from llmcli.runtime.native_step import NativeStep

    args = loaded.loaded.args
    logits = []
    for threads in (1, 3):
        step = NativeStep(loaded.loaded.model, threads=threads)
        cache = new_cache(args, 128, torch.device("cpu"), torch.float32, "f16")
        with torch.inference_mode():
            tok, out = torch.tensor([[5]]), []
            for _ in range(100):
                out.append(step(tok, cache, last_only=True))
                tok = out[-1][0, -1].argmax().view(1, 1)
        logits.append(torch.cat(out, 1))
    assert torch.equal(logits[0], logits[1])


def test_each_refined_activation_changes_only_what_reads_it(variant, tmp_path):
    """The step's mask (native/step.py's REFINE) on every variant: the head's int8x2 input moves the
    logits and leaves the hidden states as they were; the layers' moves both; all of them equal a
    step made `refined=True` (what q8's int8x2 and the torch path's step take)."""
    import numpy as np

    from llmcli.formats.open import open_model_file
    from llmcli.runtime.lean_step import LeanModel

    lean = LeanModel.open(open_model_file(write_case("llama-q4_1", tmp_path)), 2, native.module())
    ids = [5, 17, 80, 3, 200, 41, 9, 150]

    def run(mask):
        lean.refined = mask
        logits, h, _ = lean(ids, lean.new_cache(16), last_only=False)
        return logits, h

    (l0, h0), (lh, hh), (ll, hl), (la, ha) = run(0), run(8), run(7), run(15)
    assert np.array_equal(h0, hh) and not np.array_equal(l0, lh)
    assert not np.array_equal(h0, hl) and np.array_equal(hl, ha) and not np.array_equal(ll, la)
    lean.refined = True  # (a bool: every activation, as the torch path's step passes it)
    assert np.array_equal(lean(ids, lean.new_cache(16), last_only=False)[0], la)
    assert np.abs(la - l0).max() < 0.05 * np.abs(l0).max()
