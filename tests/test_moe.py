"""Mixture-of-experts models (models/moe.py, qwen3moe.py): Qwen3-MoE from an HF folder against
transformers in float32, from GGUF files written as llama.cpp writes them (3-D expert tensors, a
router) against transformers holding what the file holds, through `run` and `chat`, and files whose
experts disagree with their metadata refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import run_cli

PROMPT = [[5, 17, 80, 3, 200, 41, 9, 150, 33, 61]]
CONFIGS = {  # name: (transformers model_type, overrides)
    "qwen3moe-top2-of-8-normalized": ("qwen3_moe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                                         norm_topk_prob=True)),
    "qwen3moe-top3-of-6-raw": ("qwen3_moe", dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=48,
                                                 norm_topk_prob=False)),
    "qwen3moe-every-second-layer": ("qwen3_moe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                                      norm_topk_prob=True, num_hidden_layers=4, decoder_sparse_step=2,
                                                      mlp_only_layers=[3])),
    "qwen2moe-shared-expert": ("qwen2_moe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                                 shared_expert_intermediate_size=96, norm_topk_prob=False)),
    "mixtral": ("mixtral", dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=64)),
    "olmoe": ("olmoe", dict(num_experts=8, num_experts_per_tok=3, intermediate_size=32, norm_topk_prob=False)),
    "olmoe-clipped": ("olmoe", dict(num_experts=8, num_experts_per_tok=3, intermediate_size=32, clip_qkv=0.5)),
}
GGUF_CASES = ["qwen3moe-top2-of-8-normalized", "qwen2moe-shared-expert", "mixtral", "olmoe"]


def _moe(name: str = "qwen3moe-top2-of-8-normalized"):
    from tiny import hf_model

    model_type, overrides = CONFIGS[name]
    return hf_model(model_type, seed=1, **overrides)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_qwen3_moe_folder_gives_transformers_logits(name, tmp_path):
    from tiny import save_hf

    from llmcli.runtime.runtime import open_model

    model = _moe(name)
    rt = open_model(str(save_hf(model, tmp_path / "m")), device="cpu", dtype="float32", ctx_size=64)
    args = rt.loaded.args
    model_type, overrides = CONFIGS[name]
    assert args.model_type == model_type and args.num_experts == _experts(model.config)
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        want = model(ids).logits
        got = rt.loaded.model(ids, rt.new_cache())
        assert (got - want).abs().max() < 1e-4 * want.abs().max()
        cache = rt.new_cache()  # and token by token through the cache
        rt.loaded.model(ids[:, :6], cache)
        steps = [rt.loaded.model(ids[:, i:i + 1], cache)[0, -1] for i in range(6, ids.shape[1])]
        assert (torch.stack(steps) - want[0, 6:]).abs().max() < 1e-4 * want.abs().max()


def _experts(cfg) -> int:
    return getattr(cfg, "num_experts", None) or cfg.num_local_experts


def _reference(model, held: dict[str, np.ndarray]):
    """transformers' model holding what a GGUF holds: per-expert matrices back into its 3-D tensors."""
    import copy

    ref = copy.deepcopy(model)
    cfg = model.config
    with torch.no_grad():
        for name, p in ref.state_dict().items():
            if name in held:
                p.copy_(torch.from_numpy(held[name]))
            elif name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
                base = name.rsplit(".", 1)[0]
                kinds = ("gate", "up") if name.endswith("gate_up_proj") else ("down",)
                p.copy_(torch.stack([torch.cat([torch.from_numpy(held[f"{base}.{e}.{k}_proj.weight"]) for k in kinds])
                                     for e in range(_experts(cfg))]))
    return ref


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
@pytest.mark.parametrize("name", GGUF_CASES)
def test_a_moe_gguf_gives_the_logits_of_what_it_holds(name, qtype, tmp_path):
    """As llama.cpp's converter writes them: 3-D expert tensors, the router, qwen2moe's shared expert
    and its gate vector, Mixtral as a llama with experts (Q/K rows permuted), OLMoE's whole-q/k norms.
    llama.cpp renormalizes the top k for qwen3moe and Mixtral, not for qwen2moe and OLMoE."""
    from tiny import write_gguf

    from llmcli.runtime.runtime import open_model

    model = _moe(name)
    path = tmp_path / f"moe.{qtype}.gguf"
    held = write_gguf(model, path, qtype)
    rt = open_model(str(path), device="cpu", dtype="float32", ctx_size=64)
    assert rt.loaded.args.model_type == CONFIGS[name][0]
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        want = _reference(model, held)(ids).logits
        got = rt.loaded.model(ids, rt.new_cache())
    if qtype == "F32":  # the same numbers
        assert (got - want).abs().max() < 1e-4 * want.abs().max()
        return
    # Q8_0 blocks multiply with int8 activations, as llama.cpp's do: within a few percent, except where
    # that rounding flips a router's near tie (another expert: one position in ten here)
    per_position = (got - want).abs().amax(-1)[0] / want.abs().max()
    assert per_position.median() < 3e-2 and (per_position < 3e-2).float().mean() >= 0.7, per_position
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.8


def test_run_and_chat_answer_with_a_moe_gguf(tmp_path):
    from tiny import write_gguf

    path = tmp_path / "moe.gguf"
    write_gguf(_moe(), path, "Q8_0")
    r = run_cli("run", str(path), "hello there", "-n", "6", "--temp", "0", "--ignore-eos", "-c", "64", "--json")
    assert r.returncode == 0, r.stderr
    assert '"completion_tokens": 6' in r.stdout
    r = run_cli("chat", str(path), "--temp", "0", "-n", "4", "-c", "128", input="hi\nagain\n")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("change, tensor", [({"qwen3moe.expert_count": 6}, "blk.0.ffn_gate"),
                                            ({"qwen3moe.expert_feed_forward_length": 16}, "blk.0.ffn_")])
def test_a_gguf_whose_experts_disagree_with_its_metadata_is_refused(change, tensor, tmp_path):
    from tiny import write_gguf

    path = tmp_path / "bad.gguf"
    write_gguf(_moe(), path, "Q8_0", metadata=change)
    r = run_cli("run", str(path), "hi", "-n", "2", "-c", "64")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error:") and tensor in lines[-1] and "Traceback" not in r.stderr, r.stderr


def test_show_prints_the_experts_and_the_active_parameters(tmp_path):
    import json

    from tiny import write_gguf

    path = tmp_path / "moe.gguf"
    model = _moe()
    write_gguf(model, path, "F32")
    r = run_cli("show", str(path), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    cfg = model.config
    idle = cfg.num_hidden_layers * (_experts(cfg) - cfg.num_experts_per_tok) * 3 * cfg.hidden_size * cfg.moe_intermediate_size
    assert out["experts"] == 8 and out["active_experts"] == 2
    assert out["active_parameters"] == out["parameters"] - idle
    text = run_cli("show", str(path)).stdout
    assert "8, 2 active a token" in text


def test_the_memory_plan_counts_every_expert_and_says_what_a_token_reads(tmp_path):
    import json

    from tiny import write_gguf

    path = tmp_path / "moe.gguf"
    write_gguf(_moe(), path, "Q8_0")  # (kept as stored: the plan's weights are the file's)
    r = run_cli("show", str(path), "--memory", "--json", "-c", "64")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    weights = next(p["bytes"] for p in plan["parts"] if p["name"].startswith("weights"))
    assert weights >= path.stat().st_size * 0.9  # every expert's bytes
    assert 0 < plan["active_weight_bytes"] < weights
    assert "a token reads 2 of them" in run_cli("show", str(path), "--memory", "-c", "64").stdout


def test_a_moe_model_serves_and_takes_grammars_guesses_and_tools(tmp_path):
    """The same code paths as a dense model's: the server (4 rows, the openai client) answers as
    generate() does, a JSON schema constrains the output, prompt-lookup guesses keep the greedy
    answer, and --tool-choice required writes a call the tools' schemas accept."""
    import json

    import jsonschema
    import openai
    from tiny import save_hf
    from tool_templates import TEMPLATES

    from llmcli.decode.request import Request
    from llmcli.decode.sampling_plain import SamplingParams
    from llmcli.runtime.runtime import open_model
    from llmcli.serve.http import Server
    from llmcli.serve.listener import bind

    template, bos, eos = TEMPLATES["qwen2.5"]
    from tiny import hf_model

    model = hf_model("qwen3_moe", seed=1, max_position_embeddings=2048, **CONFIGS["qwen3moe-top2-of-8-normalized"][1])
    folder = save_hf(model, tmp_path / "m", template, tools=True, bos=bos, eos=eos)
    rt = open_model(str(folder), device="cpu", dtype="float32", ctx_size=256)
    ask = [{"role": "user", "content": "Say something."}]
    want = "".join(c.text for c in rt.generate(rt.prompt_ids(ask), Request(SamplingParams(temperature=0), 12),
                                                rt.new_cache()))
    srv = Server(rt, bind("127.0.0.1", 0), model_id="moe", rows=4).start()
    try:
        client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
        got = client.chat.completions.create(model="moe", messages=ask, max_tokens=12, temperature=0)
        assert got.choices[0].message.content == want
    finally:
        srv.close()
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
                                  "additionalProperties": False}))
    r = run_cli("run", str(folder), "Give JSON.", "--json-schema", str(schema), "--temp", "0", "-n", "200", "-c", "256")
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), json.loads(schema.read_text()))
    plain = run_cli("run", str(folder), "a b a b a b a b", "--temp", "0", "-n", "12", "-c", "256", "--ignore-eos")
    guessed = run_cli("run", str(folder), "a b a b a b a b", "--temp", "0", "-n", "12", "-c", "256", "--ignore-eos",
                      "--lookup")
    assert plain.returncode == guessed.returncode == 0 and plain.stdout == guessed.stdout
    tools = tmp_path / "tools.json"
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
        "additionalProperties": False}}}  # (a random model would write a free string on and on)
    tools.write_text(json.dumps([weather]))
    r = run_cli("run", str(folder), "Weather in Paris?", "--tools", str(tools), "--tool-choice", "required",
                "--temp", "0", "-n", "120", "-c", "1024")
    assert r.returncode == 0, r.stderr
    calls = json.loads(r.stdout)
    assert calls and calls[0]["name"] == "get_weather"
    jsonschema.validate(calls[0]["arguments"], weather["function"]["parameters"])


@pytest.mark.parametrize("name, qtype", [("qwen3moe-top2-of-8-normalized", "Q8_0"), ("mixtral", "Q4_0"),
                                         ("qwen3moe-top3-of-6-raw", "Q4_K"), ("qwen2moe-shared-expert", "Q8_0")])
def test_the_native_step_runs_the_experts_as_the_model_does(name, qtype, tmp_path, monkeypatch):
    """The one-call C++ step (llmcli_step_set_experts) against the model's own forward on the same
    blocks: the router's float32 scores, the top k, each chosen expert's gate/up/down as stored, the
    weighted sum; a prompt in one call, then single steps, then a batch of rows through pieces()."""
    from tiny import hf_model, write_gguf

    from llmcli import native
    from llmcli.cache import new_cache
    from llmcli.models import llama
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    if not native.int8_dot():
        pytest.skip("no SIMD kernels here")

    def forward(self, x):  # norms summed in float64, as the C++ step sums them (test_native_step's)
        xf = x.float()
        r = 1.0 / torch.sqrt((xf.double() ** 2).mean(-1, keepdim=True).float() + self.eps)
        return self.weight * (xf * r).to(x.dtype)

    monkeypatch.setattr(llama.RMSNorm, "forward", forward)
    monkeypatch.setenv("LLMCLI_ACTIVATIONS", "int8")  # (the model's products and the step's alike)
    model_type, overrides = CONFIGS[name]
    overrides = {**overrides, "moe_intermediate_size": 256} if "moe_intermediate_size" in overrides else \
        {**overrides, "intermediate_size": 256}  # (rows of 256: K-quants)
    if "shared_expert_intermediate_size" in overrides:
        overrides["shared_expert_intermediate_size"] = 512
    path = tmp_path / "moe.gguf"
    write_gguf(hf_model(model_type, seed=1, hidden_size=256, **overrides), path, qtype)
    rt = open_model(str(path), device="cpu", ctx_size=64)
    assert rt.native_decodes and isinstance(rt.decode_step(False), NativeStep)
    model, step = rt.loaded.model, NativeStep(rt.loaded.model, threads=2)
    caches = [new_cache(rt.loaded.args, 64, torch.device("cpu"), torch.float32) for _ in range(2)]
    worst = 0.0
    with torch.inference_mode():
        got, want = step(torch.tensor([PROMPT[0][:8]]), caches[0]), model(torch.tensor([PROMPT[0][:8]]), caches[1])
        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
        for tok in (7, 99, 250, 31):
            got = step(torch.tensor([[tok]]), caches[0], last_only=True)
            want = model(torch.tensor([[tok]]), caches[1], last_only=True)
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
        assert worst < 1e-4, worst  # (an int8 code flip would show as a few percent)
        batch = new_cache(rt.loaded.args, 64, torch.device("cpu"), torch.float32, batch=3)
        logits, _ = step.pieces([(0, 0, [5, 17, 80]), (1, 0, [3, 200]), (2, 0, [41])], batch)
        for row, ids in enumerate(([5, 17, 80], [3, 200], [41])):
            alone = model(torch.tensor([ids]), new_cache(rt.loaded.args, 64, torch.device("cpu"), torch.float32))
            assert (logits[row] - alone[0, -1]).abs().max() < 1e-4 * alone.abs().max()
