"""llmcli's own formats as GGUF blocks (quant/held.py): q4, q8 and q4_mixed, quantized at load or
from a checkpoint, held as Q4_1/Q4_0/Q8_0 blocks where the kernels multiply them with integer dot
products, and decoded by the native step. The conversion is exact up to float16 scales; each CPU
kind chooses its formats and step; the step's logits are the eager path's within the rounding of
int8 activations (the bound test_gguf_kquants.py gives GGUF files)."""

from __future__ import annotations

import pytest
import torch
from conftest import run_cli

from llmcli import native
from llmcli.quant.gguf_blocks import dequantize_blocks
from llmcli.quant.gguf_encode import to_blocks
from llmcli.quant.held import describe, model_formats
from llmcli.quant.presets import load_preset
from llmcli.quant.primitives import dequantize, pack_int4, quantize

CPU = torch.device("cpu")
IDS = [5, 17, 80, 3, 200, 41, 9, 150, 7, 99, 250, 31, 2, 64, 120, 8, 33, 71, 18, 240,
       6, 90, 111, 44, 13, 160, 27, 55, 300, 1, 77, 140, 12, 66, 210, 4]  # 36: past the eager path's dense rows


def _folder(tmp_path_factory, model_type: str, tied: bool):
    from tiny import hf_model, save_hf

    # rows of 256 and of 320 (the down projection): q4_g128 falls back to groups of 64 there
    model = hf_model(model_type, hidden_size=256, intermediate_size=320, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, tie_word_embeddings=tied, seed=3)
    return save_hf(model, tmp_path_factory.mktemp(model_type) / "model")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return _folder(tmp_path_factory, "llama", tied=True)


@pytest.fixture(scope="module", params=[("llama", True), ("qwen2", False), ("gemma3_text", True), ("phi3", False)],
                ids=["llama-tied", "qwen2-biases", "gemma3", "phi3"])
def any_folder(request, tmp_path_factory, tiny_folder):
    """The tied llama, a qwen2 with its own output head and q/k/v biases, a gemma3 (its scaled
    embedding, four norms a layer, local layers) and a phi3 (q/k/v and gate/up fused in the file)."""
    return tiny_folder if request.param[0] == "llama" else _folder(tmp_path_factory, *request.param)


@pytest.fixture
def int8_dot():
    if not native.int8_dot():
        pytest.skip("no kernels with integer dot products on this CPU (or no compiler): the blocks are not held")


# ------------------------------------------------------------------------------------ conversion


@pytest.mark.parametrize("bits,symmetric,type_name", [(4, False, "Q4_1"), (4, True, "Q4_0"), (8, True, "Q8_0")])
def test_blocks_dequantize_to_the_packed_weights_up_to_float16_scales(bits, symmetric, type_name):
    """d is the bfloat16 scale exactly (bfloat16 in float16's range is a float16); Q4_1's m = z - 8s
    is rounded once to float16; the codes are the same. Packed two a byte (a checkpoint's form) or
    not (quantizing at load), the blocks are the same bytes."""
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(48, 512, generator=gen) * 0.05
    w[3, :32] *= 40  # an outlier group
    w[5, 64:96] += 0.3  # a group away from zero: Q4_1's m far from -8d
    q = quantize(w, bits, 32, symmetric, search=False)
    offset = None if q.zeros is None else q.zeros.float() - 8 * q.scales.float()
    blocks = to_blocks(q.codes, q.scales, offset, type_name)
    assert blocks.dtype == torch.uint8 and blocks.shape == (48, 16 * {"Q4_1": 20, "Q4_0": 18, "Q8_0": 34}[type_name])
    if bits == 4:
        assert torch.equal(to_blocks(pack_int4(q.codes), q.scales, offset, type_name, packed=True), blocks)
    back, ref = dequantize_blocks(blocks, type_name, 512), dequantize(q.codes, q.scales, q.zeros, bits, 32)
    d = blocks.view(48, 16, -1)[..., :2].contiguous().view(torch.float16).float().view(48, 16)
    assert torch.equal(d, q.scales.float())
    if type_name != "Q4_1":
        assert torch.equal(back, ref)  # d * q, the same product
        return
    m = offset.to(torch.float16).float()
    bound = (m.abs() * 2**-11 + (q.scales.float().abs() * 16 + q.zeros.float().abs()) * 2**-22)  # m's rounding
    assert ((back - ref).abs().view(48, 16, 32) <= bound[..., None]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bits,symmetric,type_name", [(4, False, "Q4_1"), (4, True, "Q4_0"), (8, True, "Q8_0")])
def test_the_native_quantizer_writes_the_blocks_min_max_quantizing_and_to_blocks_make(dtype, bits, symmetric,
                                                                                      type_name):
    """Quantizing at load in the native library (llmcli_quantize_weights, from the file's own floats):
    byte for byte quantize(search=False) then to_blocks, with the groups that test the rules: all
    zeros, all equal, a tie of +peak and -peak, a lone outlier, values a half-level apart. Scales past
    float16 are refused (the loader keeps llmcli's own layout then)."""
    from llmcli.quant.gguf_blocks import TYPE_IDS

    if native.module() is None:
        pytest.skip("no C++ compiler for the kernels")
    runnable = [native.load(v) for v in native.variants() if native.why_not(v) is None]  # each variant's vectors
    g = torch.Generator().manual_seed(7)
    w = torch.randn(40, 256, generator=g) * 0.05
    w[0] = 0
    w[1, :32] = 0.01
    w[2, :32] = torch.tensor([0.5, -0.5] * 16)
    w[3, 7] = -3.0
    w[4, :32] = torch.arange(32) * 0.5 - 8
    w = w.to(dtype)
    q = quantize(w, bits, 32, symmetric, search=False)
    offset = None if symmetric else q.zeros.float() - 8 * q.scales.float()
    want = to_blocks(q.codes, q.scales, offset, type_name)
    for kernels in runnable:
        assert torch.equal(kernels.quantize_weights(w, TYPE_IDS[type_name]), want), kernels.variant
        if dtype is torch.float32:
            assert kernels.quantize_weights(w * 1e8, TYPE_IDS[type_name]) is None


def test_quantizing_at_load_reports_progress_in_bytes_of_the_weights(tiny_folder):
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    seen = []
    load_model(tiny_folder, place("cpu", "float32", 1), load_preset("q8"), progress=lambda *a: seen.append(a))
    assert {label for label, _, _ in seen} == {"quantizing (q8)"}
    done = [d for _, d, _ in seen]
    assert done == sorted(done) and done[-1] == seen[-1][2] > 0


# -------------------------------------------------------------------------------- choice per kind

FORMATS = {  # preset: (as held where blocks multiply with integer dot products, as held elsewhere)
    "q4": ("Q4_1, Q8_0", "int4_g32, int8_g32"),
    "q8": ("Q8_0", "int8_g32"),
    "q4_mixed": ("Q4_1, Q8_0", "int4_g32, int8_g32"),  # layer 2's v_proj and down_proj at 8 bits
    "q4_g128": ("int4_g128, int4_g64, Q8_0", "int4_g128, int4_g64, int8_g32"),  # llmcli's own layout
    None: ("F16", "F16"),  # the float32 folder as F16 rows: any kernel variant multiplies them
}


@pytest.mark.parametrize("preset", list(FORMATS), ids=lambda p: p or "as-stored")
def test_each_cpu_kind_holds_what_its_kernels_multiply_and_picks_the_step(cpu_kind, tiny_folder, preset):
    """Kinds with integer dot products (all but the portable kernels) hold g32 weights as blocks and
    decode q4, q8 and q4_mixed through the native step, in float32 with a float16 cache; q4_g128
    keeps today's path, as does a CPU without them. The unquantized folder decodes through the step
    as F16 rows on every kind. CUDA and MPS keep llmcli's formats (and floats) for torch's kernels.
    Chosen from the headers: no kernel runs."""
    from llmcli.formats.open import open_model_file
    from llmcli.runtime.device import Placement, place
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.probe import weights_from_files
    from llmcli.runtime.runtime import native_placement

    mf = open_model_file(tiny_folder)
    p = load_preset(preset) if preset else None
    blocks = cpu_kind.name != "old"
    held = FORMATS[preset][0 if blocks else 1]
    assert describe(model_formats(mf, p, CPU).values()) == held
    decodes = preset is None or (blocks and preset in ("q4", "q8", "q4_mixed"))
    assert NativeStep.decodes(mf, p) == decodes
    auto = place("cpu", "auto", 1)
    placement, kv = native_placement(mf, auto, p)
    assert (placement.dtype, kv) == ((torch.float32, "f16") if decodes else (auto.dtype, None))
    if p is not None:
        assert weights_from_files(mf, p, placement.dtype, CPU).label == f"{preset} from float32 as {held}"
    for gpu in ("cuda", "mps"):  # planned without the device: held_spec reads only its type
        assert describe(model_formats(mf, p, torch.device(gpu)).values()) == (FORMATS[preset][1] if p else "float")
        there = Placement(torch.device(gpu), torch.bfloat16, 1, "test")
        assert native_placement(mf, there, p) == (there, None)


# ------------------------------------------------------------------------------------- the step


def _logits(step, args, ids: list[int]) -> torch.Tensor:
    from llmcli.cache import new_cache

    with torch.inference_mode():
        return step(torch.tensor([ids]), new_cache(args, len(ids), CPU, torch.float32))[0]


@pytest.mark.parametrize("preset", ["q4", "q8", "q4_mixed"])
def test_the_native_step_gives_the_eager_paths_logits(int8_dot, any_folder, preset, monkeypatch):
    """--quant at load on the CPU: blocks, the native step in float32 with a float16 cache. Against
    today's path (the same preset as int4/int8 modules for torch's kernels, 36 tokens: their
    dequantized weights in a dense GEMM): the blocks' own eager forward (dense tiles too) differs only
    by Q4_1's float16 m; the step, quantizing its activations to int8 per 32 as llama.cpp does, stays
    on average within the 5 % of the largest logit test_gguf_kquants.py allows int8 activations alone
    (1.5-3.4 % measured there, over 8 tokens), and every token within test_native_step.py's 10 % for
    a rounding flip."""
    from llmcli.quant.modules import GGUFBlockLinear, QuantLinear
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(any_folder), quant=preset, device="cpu", ctx_size=64, threads=2)
    assert rt.placement.dtype == torch.float32 and rt.kv_type == "f16"
    step = rt.decode_step(compile=False)
    assert isinstance(step, NativeStep)
    model = rt.loaded.model
    assert rt.loaded.weights_type == f"{preset} (from float32) as {FORMATS[preset][0]}"
    got = _logits(step, rt.loaded.args, IDS)
    blocks_eager = _logits(model, rt.loaded.args, IDS)
    monkeypatch.setattr(native, "int8_dot", lambda: False)  # today's path: llmcli's own layout
    today = load_model(any_folder, place("cpu", "float32", 2), load_preset(preset)).model.fuse()
    assert not any(isinstance(m, GGUFBlockLinear) for m in today.modules())
    assert sum(isinstance(m, QuantLinear) for m in today.modules()) >= 12  # fused: 4 a layer
    ref = _logits(today, rt.loaded.args, IDS)
    top = ref.abs().max()
    if preset == "q8":  # Q8_0's d is the bfloat16 scale: the same weights
        assert torch.equal(blocks_eager, ref)
    else:  # Q4_1's m rounded to float16
        assert (blocks_eager - ref).abs().max() < 0.01 * top
    per_token = (got - ref).abs().amax(-1) / top
    assert per_token.mean() < 0.05 and per_token.max() < 0.1, per_token


@pytest.mark.parametrize("preset", ["q4", "q8", "q4_mixed"])
def test_a_checkpoint_loads_as_the_blocks_quantizing_at_load_makes(tmp_path, tiny_folder, preset):
    """`llmcli quantize --no-search` (min/max scales, as at load) then `run DIR`: its stored codes and
    scales become the same blocks byte for byte, and the same logits through the same step."""
    from llmcli.quant.pipeline import quantize_to_folder
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    quantize_to_folder(tiny_folder, preset, tmp_path / "ck", search=False)
    at_load = open_model(str(tiny_folder), quant=preset, device="cpu", ctx_size=64, threads=2)
    saved = open_model(str(tmp_path / "ck"), device="cpu", ctx_size=64, threads=2)
    held = FORMATS[preset][0 if native.int8_dot() else 1]
    assert saved.loaded.weights_type == f"{preset} (llmcli) as {held}"
    assert saved.placement == at_load.placement and saved.kv_type == at_load.kv_type
    ours = {n: m.packed.state() for n, m in saved.loaded.model.named_modules() if hasattr(m, "packed")}
    theirs = {n: m.packed.state() for n, m in at_load.loaded.model.named_modules() if hasattr(m, "packed")}
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[n][k], theirs[n][k]) for n in ours for k in ours[n])
    steps = saved.decode_step(compile=False), at_load.decode_step(compile=False)
    assert all(isinstance(s, NativeStep) for s in steps) == native.int8_dot()
    assert torch.equal(_logits(steps[0], saved.loaded.args, IDS[:12]), _logits(steps[1], at_load.loaded.args, IDS[:12]))


def test_run_says_the_folder_decodes_natively_as_q4_1_blocks(int8_dot, tiny_folder):
    r = run_cli("run", str(tiny_folder), "--quant", "q4", "Hi", "-n", "3", "--temp", "0", "-v")
    assert r.returncode == 0, r.stderr
    assert "weights q4 from float32 as Q4_1, Q8_0" in r.stderr  # the memory plan
    assert "(llama, 3 layers, float32 safetensors quantized to q4 at load, held as Q4_1, Q8_0)" in r.stderr
    assert (f"decode step: native (one C++ call a step, {native.variant()} kernels, int8 activations (llama.cpp's), "
            "f16 KV cache)\n") in r.stderr


@pytest.mark.slow
def test_smollm2_requantized_to_q8_decodes_natively_near_its_own_weights(int8_dot, smollm2_gguf):
    """The real model's Q4_1 GGUF with --quant q8: every matrix requantized to Q8_0 blocks (the
    embedding's Q8_0 taken as it is), the native step, and next-token distributions near the file's
    own weights dequantized: q8's int8x2 activations leave the 8-bit weights' error (1.3e-3 mean KL
    divergence measured here), where int8 ones added as much again (3.6e-3, docs/quantize.md)."""
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(smollm2_gguf), quant="q8", device="cpu", ctx_size=256)
    assert rt.loaded.weights_type == "q8 (from Q4_1) as Q8_0"
    step = rt.decode_step(compile=False)
    assert isinstance(step, NativeStep)
    text = "The capital of France is Paris. The quick brown fox jumps over the lazy dog. " * 4
    ids = rt.loaded.tokenizer.encode(text)
    ours = _logits(step, rt.loaded.args, ids).log_softmax(-1)
    ref = _logits(load_model(smollm2_gguf, place("cpu", "float32"), load_preset("f32")).model, rt.loaded.args, ids)
    ref = ref.log_softmax(-1)
    kld = (ref.exp() * (ref - ours)).sum(-1)
    assert float(kld.mean()) < 0.0025
    assert float((ref.argmax(-1) == ours.argmax(-1)).float().mean()) > 0.9


# ------------------------------------------------------------------------- int8x2 activations


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("preset,refined", [("q4", False), ("q8", True), ("q4_mixed", True)])
def test_q8_and_q4_mixed_decode_with_int8x2_activations_and_q4_with_int8(int8_dot, tiny_folder, preset, refined):
    """The preset's `activations` marks the loaded model and every block (fused ones too) and reaches
    the native step, whose line in `run -v` says it; q4 keeps llama.cpp's int8 (and its speed)."""
    from llmcli.quant.gguf_blocks import GGUFBlockWeight
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(tiny_folder), quant=preset, device="cpu", ctx_size=64, threads=2)
    model = rt.loaded.model
    assert model.activations == ("int8x2" if refined else "int8")
    blocks = [m.packed for m in model.modules() if isinstance(getattr(m, "packed", None), GGUFBlockWeight)]
    assert blocks and all(b.refined == refined for b in blocks)
    assert any(b.shape[0] > 256 for b in blocks)  # (fused q/k/v among them)
    step = rt.decode_step(compile=False)
    assert bool(step.refined) == refined
    assert ("int8x2 activations" in rt.describe_step(step)) == refined


def test_a_gguf_file_as_stored_takes_int8x2_where_small_and_llama_cpp_s_int8_where_large(int8_dot, tmp_path,
                                                                                          monkeypatch):
    from tiny import hf_model, write_gguf

    from llmcli.quant import precision
    from llmcli.runtime.runtime import open_model

    path = tmp_path / "q8.gguf"
    write_gguf(hf_model("llama", hidden_size=256, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, tie_word_embeddings=True, seed=3), path, "Q8_0")
    rt = open_model(str(path), device="cpu", ctx_size=64)
    assert rt.loaded.model.activations == "int8x2" and rt.decode_step(compile=False).refined == precision.SMALL_FILES
    monkeypatch.setattr(precision, "REFINE_UP_TO", path.stat().st_size - 1)  # (as a file past the size)
    rt = open_model(str(path), device="cpu", ctx_size=64)
    assert rt.loaded.model.activations == "int8" and not rt.decode_step(compile=False).refined


@pytest.mark.parametrize("preset", ["q8", "q4_mixed"])
def test_int8x2_activations_bring_the_step_ten_times_nearer_the_float_activations(int8_dot, any_folder, preset):
    """The same blocks, three ways over 36 tokens: the eager path's dense tiles (the weights
    dequantized, float activations: the reference), the native step with int8x2 activations and
    with int8 ones. int8x2's logits are at least 10 times nearer the reference on every token."""
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(any_folder), quant=preset, device="cpu", ctx_size=64, threads=2)
    model, args = rt.loaded.model, rt.loaded.args
    ref = _logits(model, args, IDS)  # (36 rows: the dense tiles, no int8 at all)
    refined = _logits(NativeStep(model), args, IDS)
    model.activations = "int8"
    int8 = _logits(NativeStep(model), args, IDS)
    for i in range(len(IDS)):
        assert 10 * _relative(refined[i], ref[i]) < _relative(int8[i], ref[i]), i


def test_the_int8x2_step_gives_the_eager_paths_int8x2_steps(int8_dot, any_folder):
    """One-token steps from the same cache: the native step, and the model eagerly (each projection
    through native.mm with int8x2 activations). Where float32 rounding differs, a code still rounds
    the other way now and then, but the residual takes up what it leaves: the step moves by about
    int8x2's own resolution (1e-4 of the largest logit measured, against 2e-7 without a flip), where
    int8 activations allow a flip of a few percent (test_native_step.py's _compare)."""
    import copy

    from llmcli.cache import new_cache
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(any_folder), quant="q8", device="cpu", ctx_size=64, threads=2)
    model, args = rt.loaded.model, rt.loaded.args
    step = NativeStep(model, threads=3)
    assert step.refined
    cache = new_cache(args, 64, CPU, torch.float32)
    worst = 0.0
    with torch.inference_mode():
        model(torch.tensor([IDS[:8]]), cache)
        for tok in IDS[8:20]:
            theirs = copy.deepcopy(cache)
            got = step(torch.tensor([[tok]]), cache, None, True, True)
            want = model(torch.tensor([[tok]]), theirs, None, True, True)
            worst = max(worst, *(_relative(g, w) for g, w in zip(got, want)))
    assert worst < 5e-4, worst


def test_int8x2_rows_of_a_batch_get_what_each_gets_alone(int8_dot, tiny_folder):
    """Two stored rows a token, side by side in the activations' groups: a call's rows (5 rows of 1
    to 6 tokens, 20 in all; and 5 one-token rows) give each row's last token bit for bit what that
    row's tokens give in a call of their own."""
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(tiny_folder), quant="q8", device="cpu", ctx_size=64, threads=2)
    step = NativeStep(rt.loaded.model, threads=3)
    assert step.refined
    g = torch.Generator().manual_seed(5)
    for sizes in ([6, 3, 5, 2, 4], [1, 1, 1, 1, 1]):
        pieces = [(row, 0, torch.randint(3, 250, (n,), generator=g).tolist()) for row, n in enumerate(sizes)]
        batch = rt.new_cache(rows=len(pieces))
        with torch.inference_mode():
            logits, hidden = step.pieces(pieces, batch)
            for i, (_, _, ids) in enumerate(pieces):
                alone, alone_hidden = step(torch.tensor([ids]), rt.new_cache(), last_only=True, hidden=True)
                assert torch.equal(logits[i], alone[0, -1]) and torch.equal(hidden[i], alone_hidden[0, -1]), (sizes, i)


def test_a_checkpoint_records_its_activations(tmp_path, tiny_folder):
    """`llmcli quantize` writes the preset's activations into the quantization block, and a
    checkpoint loads with them; one without the key (older) takes int8, one with an unknown value
    is refused in one line."""
    import json

    from llmcli.errors import CorruptModelError
    from llmcli.quant.pipeline import quantize_to_folder
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    quantize_to_folder(tiny_folder, "q8", tmp_path / "ck", search=False)
    config_path = tmp_path / "ck" / "config.json"
    config = json.loads(config_path.read_text())
    assert config["quantization"]["activations"] == "int8x2"
    assert load_model(tmp_path / "ck", place("cpu", "float32", 1)).model.activations == "int8x2"
    del config["quantization"]["activations"]
    config_path.write_text(json.dumps(config))
    assert load_model(tmp_path / "ck", place("cpu", "float32", 1)).model.activations == "int8"
    config["quantization"]["activations"] = "int4"
    config_path.write_text(json.dumps(config))
    with pytest.raises(CorruptModelError, match="'int4' activations") as e:
        load_model(tmp_path / "ck", place("cpu", "float32", 1))
    assert "\n" not in str(e.value)
