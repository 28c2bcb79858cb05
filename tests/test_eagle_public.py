"""Public EAGLE heads (--method eagle --eagle-head FOLDER|HUB_ID) on tiny random fp32 targets: random heads
written in the authors' layouts (EAGLE-1/2: config.json + model.safetensors; EAGLE-3: config.json +
pytorch_model.bin with d2t) load; each maps onto the same function as an independent reference built
from transformers' own Llama layer and attention (so keys, fc order and rotary are right, not only
lossless); greedy output equals plain greedy; sampled sequences follow the target's law; a head for
another hidden size or vocabulary, a missing folder and an unreachable Hub id are one clear message."""
import json
from types import SimpleNamespace

import pytest
import torch
from helpers import check_stream, fake_pair, follows_target, run
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from specviz.engine.decoding import baseline, speculative
from specviz.engine.proposers import eagle as eagle_mod
from specviz.engine.proposers import make_proposer
from specviz.engine.proposers.eagle import EagleProposer, load_public
from specviz.engine.sampling import SamplingParams
from specviz.engine.trained import public_heads
from specviz.errors import RequestError
from specviz.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0)
PROMPT = "def quicksort(arr): arr arr"


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    eagle_mod._PUBLIC.clear()
    yield
    torch.set_num_threads(n)


def tiny_llama(vocab, layers=8, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      initializer_range=0.2, tie_word_embeddings=False, rope_theta=500000.0,
                      eos_token_id=0, bos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval().requires_grad_(False)


def head_config(target, arch, **extra):
    c = target.config
    return {"architectures": [arch], "model_type": "llama", "hidden_size": c.hidden_size, "intermediate_size": 48,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "vocab_size": c.vocab_size, "max_position_embeddings": 1024, **extra}


def _attn_mlp(prefix, h, inp, g, bias):
    """q/k/v over `inp` features (4 heads, 2 kv heads), o, and a 48-wide MLP: random, EAGLE's key names."""
    d = h // 4
    sd = {}
    for n, rows in (("q", 4 * d), ("k", 2 * d), ("v", 2 * d)):
        sd[f"{prefix}self_attn.{n}_proj.weight"] = torch.randn(rows, inp, generator=g) * 0.3
        if bias:
            sd[f"{prefix}self_attn.{n}_proj.bias"] = torch.randn(rows, generator=g) * 0.3
    sd[f"{prefix}self_attn.o_proj.weight"] = torch.randn(h, 4 * d, generator=g) * 0.3
    for n, shape in (("gate", (48, h)), ("up", (48, h)), ("down", (h, 48))):
        sd[f"{prefix}mlp.{n}_proj.weight"] = torch.randn(*shape, generator=g) * 0.3
    sd[f"{prefix}post_attention_layernorm.weight"] = 1 + torch.randn(h, generator=g) * 0.1
    return sd


def write_eagle1(folder, target, seed=0, hidden=None, bias=True):
    """The authors' EAGLE-1/2 folder (as yuhuili/EAGLE-Qwen2-7B-Instruct): fc over [e; f], layers.0 with
    no input norm, an embed_tokens of its own (to be ignored)."""
    g = torch.Generator().manual_seed(seed)
    h, v = hidden or target.config.hidden_size, target.config.vocab_size
    sd = {"fc.weight": torch.randn(h, 2 * h, generator=g) * 0.3, "fc.bias": torch.randn(h, generator=g) * 0.3,
          "embed_tokens.weight": torch.randn(v, h, generator=g), **_attn_mlp("layers.0.", h, h, g, bias)}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(folder / "model.safetensors"))
    cfg = head_config(target, "LlamaForCausalLMEagle", hidden_size=h)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder, cfg, sd


def write_eagle3(folder, target, seed=0, draft_vocab=None, ids=None, **extra):
    """The authors' EAGLE-3 folder (as yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): pytorch_model.bin with fc over
    three states, midlayer.*, norm, lm_head over a draft vocabulary and d2t/t2d."""
    g = torch.Generator().manual_seed(seed)
    h, v = target.config.hidden_size, target.config.vocab_size
    if ids is None:
        dv = draft_vocab or v // 2
        ids = torch.randperm(v, generator=g)[:dv].sort().values
    dv = len(ids)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[ids.clamp(max=v - 1)] = True
    sd = {"fc.weight": torch.randn(h, 3 * h, generator=g) * 0.3,
          "midlayer.input_layernorm.weight": 1 + torch.randn(h, generator=g) * 0.1,
          "midlayer.hidden_norm.weight": 1 + torch.randn(h, generator=g) * 0.1,
          **_attn_mlp("midlayer.", h, 2 * h, g, False),
          "norm.weight": 1 + torch.randn(h, generator=g) * 0.1,
          "lm_head.weight": torch.randn(dv, h, generator=g) * 0.5,
          "d2t": ids - torch.arange(dv), "t2d": t2d}
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(sd, folder / "pytorch_model.bin")
    cfg = head_config(target, "LlamaForCausalLMEagle3", draft_vocab_size=dv, **extra)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder, cfg, sd


def pair_of(model, tok=None):
    return fake_pair(target=model, draft=None, tokenizer=tok, eos_ids=[0], device=model.device)


def proposer(model, folder, tok=None):
    req = SimpleNamespace(options={"eagle_head": str(folder)})
    return make_proposer(pair_of(model, tok), "eagle", req)


# ------------------------------------------------------------------ the layouts map exactly
def _causal(n):
    return torch.full((n, n), float("-inf")).triu(1)[None, None]


def test_eagle1_layer_is_the_authors_layer(tmp_path):
    """EagleHead on a public EAGLE-1/2 folder = cnets1.py's function, built here from transformers'
    LlamaDecoderLayer with no input norm: fc(cat(e, f)) -> layer; rotary from the head's config."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    target = tiny_llama(20, layers=2)
    _, cfg, sd = write_eagle1(tmp_path / "h", target, bias=False)
    head = public_heads.eagle1("h", cfg, public_heads.read(tmp_path / "h")[1], target)
    c = LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"}, attention_bias=False)
    c._attn_implementation = "eager"
    ref = LlamaDecoderLayer(c, 0)
    ref.load_state_dict({k.removeprefix("layers.0."): v for k, v in sd.items() if k.startswith("layers.0.")},
                        strict=False)
    ref.input_layernorm = nn.Identity()
    e, f, pos = torch.randn(1, 6, 32), torch.randn(1, 6, 32), torch.arange(6)
    x = nn.functional.linear(torch.cat([e, f], -1), sd["fc.weight"], sd["fc.bias"])
    out = ref(x, attention_mask=_causal(6), position_embeddings=LlamaRotaryEmbedding(c)(x, pos[None]),
              position_ids=pos[None])
    out = out[0] if isinstance(out, tuple) else out
    torch.testing.assert_close(head(e, f, pos), out, atol=1e-5, rtol=1e-4)


def test_eagle3_head_is_the_authors_midlayer(tmp_path):
    """Eagle3Head + DraftVocabHead = cnets.py's Model written out with transformers' LlamaAttention (its
    q/k/v over 2 hidden sizes) and RMSNorm: u = fc(F); [in_norm(e); hidden_norm(u)] -> attention, u its
    residual; MLP; logits = lm_head(norm(out)) placed at target ids i + d2t[i]."""
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRMSNorm, LlamaRotaryEmbedding
    target = tiny_llama(20, layers=8)
    _, cfg, sd = write_eagle3(tmp_path / "h", target, draft_vocab=9)
    state = public_heads.read(tmp_path / "h")[1]
    head, lm, taps = public_heads.eagle3("h", cfg, state, target, 20)
    assert taps == (2, 4, 5)  # layers 2, L//2, L-3 of 8, in layer order
    c = LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
    c._attn_implementation = "eager"
    attn = LlamaAttention(c, 0)
    for n in "qkv":
        setattr(attn, f"{n}_proj", nn.Linear(64, getattr(attn, f"{n}_proj").out_features, bias=False))
    attn.load_state_dict({k.removeprefix("midlayer.self_attn."): v for k, v in sd.items()
                          if k.startswith("midlayer.self_attn.")})

    def norm(name):
        m = LlamaRMSNorm(32, eps=1e-6)
        m.weight.data.copy_(sd[name])
        return m

    def mlp(y):
        return nn.functional.linear(nn.functional.silu(nn.functional.linear(y, sd["midlayer.mlp.gate_proj.weight"]))
                                    * nn.functional.linear(y, sd["midlayer.mlp.up_proj.weight"]),
                                    sd["midlayer.mlp.down_proj.weight"])
    e, feats, pos = torch.randn(1, 5, 32), torch.randn(1, 5, 96), torch.arange(5)
    u = nn.functional.linear(feats, sd["fc.weight"])
    x = torch.cat([norm("midlayer.input_layernorm.weight")(e), norm("midlayer.hidden_norm.weight")(u)], -1)
    u = u + attn(x, LlamaRotaryEmbedding(c)(x, pos[None]), _causal(5))[0]
    out = u + mlp(norm("midlayer.post_attention_layernorm.weight")(u))
    got = head(e, feats, pos)
    torch.testing.assert_close(got, out, atol=1e-5, rtol=1e-4)
    logits = nn.functional.linear(norm("norm.weight")(out), sd["lm_head.weight"])
    full = lm(got)
    ids = torch.arange(9) + sd["d2t"]
    torch.testing.assert_close(full[..., ids], logits, atol=1e-5, rtol=1e-4)
    others = torch.ones(20, dtype=torch.bool)
    others[ids] = False
    assert (full[..., others] == torch.finfo(torch.float32).min).all()  # q = 0 outside the draft vocab
    again = head(e[:, -1:], out[:, -1:], pos[-1:] + 1)  # its own output fed back: fc skipped
    assert again.shape == (1, 1, 32)


# ------------------------------------------------------------------ lossless through the engine
@pytest.mark.parametrize("layout", ["eagle1", "eagle3"])
@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_greedy_equals_plain(tmp_path, tok, target, layout, family):
    model = target if family == "qwen2" else tiny_llama(len(tok), layers=8)
    if layout == "eagle1":
        folder, _, sd = write_eagle1(tmp_path / "h", model, bias=family == "qwen2")
    else:
        folder, _, sd = write_eagle3(tmp_path / "h", model)
    ids = tok.encode(PROMPT)
    _, base = run(baseline(model, tok, ids, 32, GREEDY))
    for gamma in (1, 4):
        prop = proposer(model, folder, tok)
        assert isinstance(prop, EagleProposer) and (prop.drafter.taps is not None) == (layout == "eagle3")
        rounds, spec = run(speculative(model, prop, tok, ids, 32, gamma, GREEDY))
        assert spec.token_ids == base.token_ids and spec.drafted > 0
        check_stream(rounds, spec)
        if layout == "eagle3":  # drafts only from the draft vocabulary
            allowed = set((torch.arange(len(sd["d2t"])) + sd["d2t"]).tolist())
            assert all(d in allowed for r in rounds for d in r.draft_ids)


def test_eagle3_reads_the_inputs_of_its_layers(tmp_path, tok):
    """The rows the head reads after the prompt: the inputs of layers 2, 4, 5 of 8, concatenated."""
    from transformers import DynamicCache
    model = tiny_llama(len(tok), layers=8)
    folder, _, _ = write_eagle3(tmp_path / "h", model)
    prop = proposer(model, folder, tok)
    prop.attach_target_cache(DynamicCache())
    ids = tok.encode(PROMPT)
    prop.verify_logits(ids, [], 1)
    prop.rollback(ids + [5], 0, 0)
    hs = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    torch.testing.assert_close(prop.pend, torch.cat([hs[2][0], hs[4][0], hs[5][0]], -1))


@pytest.mark.parametrize("layout", ["eagle1", "eagle3"])
def test_sequences_follow_target_distribution(tmp_path, layout):
    """Sampled at T = 1, whole sequences follow the target's law; EAGLE-3's draft vocabulary leaves out
    token 0 (q = 0 there) and its taps are named by the config, one past the last layer (the norm's input)."""
    t = tiny_model(4, seed=10, layers=2, init=0.8)
    if layout == "eagle1":
        folder = write_eagle1(tmp_path / "h", t, seed=2)[0]
    else:
        folder = write_eagle3(tmp_path / "h", t, seed=2, ids=torch.tensor([1, 2, 3]),
                              eagle_config={"eagle_aux_hidden_state_layer_ids": [-1, 0, 1]})[0]
    d = load_public(pair_of(t), str(folder))
    if layout == "eagle3":
        assert d.taps == (0, 1, 2)
    params = SamplingParams(temperature=1.0)
    assert follows_target(t, lambda: EagleProposer(t, d, stop_below=0.0), [1, 2, 3, 1, 2], 3, 2, params,
                          1200) > 1e-3


# ------------------------------------------------------------------ clear messages
def test_a_head_for_another_hidden_size_is_refused(tmp_path, target):
    folder = write_eagle1(tmp_path / "h", target, hidden=64)[0]
    with pytest.raises(RequestError, match="hidden states of size 64.*this target's are 32"):
        proposer(target, folder)


def test_a_head_missing_a_weight_is_one_message(tmp_path, target):
    folder = write_eagle3(tmp_path / "h", target)[0]
    sd = torch.load(folder / "pytorch_model.bin", weights_only=True)
    del sd["norm.weight"]
    torch.save(sd, folder / "pytorch_model.bin")
    with pytest.raises(RequestError, match="lacks what its layout needs.*norm.weight"):
        proposer(target, folder)


def test_a_head_for_another_vocabulary_is_refused(tmp_path, target):
    v = target.config.vocab_size
    folder = write_eagle3(tmp_path / "h", target, ids=torch.tensor([0, 1, v + 3]))[0]
    with pytest.raises(RequestError, match="draft vocabulary outside this target's"):
        proposer(target, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "vocab_size": v + 1}))
    with pytest.raises(RequestError, match=f"vocabulary of {v + 1} tokens"):
        proposer(target, folder)


def test_unknown_folders_and_hub_ids_are_one_message(tmp_path, target, monkeypatch):
    with pytest.raises(RequestError, match="neither a folder here nor a Hub id"):
        proposer(target, tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RequestError, match="not an EAGLE head folder: it needs config.json"):
        proposer(target, tmp_path / "empty")
    (tmp_path / "other").mkdir()
    save_file({"w": torch.zeros(2)}, str(tmp_path / "other" / "model.safetensors"))
    (tmp_path / "other" / "config.json").write_text("{}")
    with pytest.raises(RequestError, match="Not an EAGLE head"):
        proposer(target, tmp_path / "other")
    import huggingface_hub
    asked = []

    def offline(repo_id, allow_patterns=None):
        asked.append((repo_id, allow_patterns))
        raise OSError("We couldn't connect to 'https://huggingface.co'")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(RequestError, match="could not be fetched from the Hub.*couldn't connect"):
        make_proposer(pair_of(target), "eagle", SimpleNamespace(options={"eagle_head": "someone/EAGLE3-x"}))
    assert asked == [("someone/EAGLE3-x", public_heads.FILES)]  # only the head's own files


def test_a_hub_id_loads_through_snapshot_download(tmp_path, target, monkeypatch):
    import huggingface_hub
    folder = write_eagle3(tmp_path / "snap", target)[0]
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, allow_patterns=None: str(folder))
    prop = make_proposer(pair_of(target), "eagle", SimpleNamespace(options={"eagle_head": "yuhuili/x"}))
    assert prop.drafter.taps == (0, 1, 2)


def test_the_option_is_cli_and_api_only():
    from specviz.engine.proposers import method_spec
    spec = method_spec("eagle")
    opt = next(o for o in spec.options if o.name == "eagle_head")
    assert not opt.page and opt.cli
    assert spec.check_options({"eagle_head": " a/b "})["eagle_head"] == "a/b"
    assert "eagle_head" not in spec.check_options({})  # blank: the shipped head, as before
    with pytest.raises(RequestError, match="folder or a Hub id"):
        spec.check_options({"eagle_head": 3})
    from specviz.ui import method_options
    assert method_options.collect("eagle", {"eagle_head": "a/b"}) == {}  # a page run never sends it


def test_eagle3_drafts_on_the_lean_forward(tmp_path, tok, target, monkeypatch):
    """The lean Llama-family forward (engine/cpu/lean_forward.py) does not call the decoder layers as
    modules, so their hooks never fire there: it copies the tapped layers' inputs itself
    (lean_forward.tapping). An EAGLE-3 verify keeps the lean path and drafts what the module path
    drafts, plain's output either way."""
    import copy

    from specviz.engine.cpu import lean_forward
    from specviz.engine.cpu.lean import make_lean
    from specviz.engine.cpu.rowwise_attention import use_rowwise
    model = make_lean(copy.deepcopy(target))
    use_rowwise(model)
    assert lean_forward.plan(model)[0] > 0  # plain decoding of this model takes the lean path
    folder = write_eagle3(tmp_path / "h", model)[0]
    ids = tok.encode(PROMPT)
    _, base = run(baseline(model, tok, ids, 24, GREEDY))
    _, module = run(speculative(target, proposer(target, folder, tok), tok, ids, 24, 3, GREEDY))
    calls = []
    real = lean_forward.run
    monkeypatch.setattr(lean_forward, "run", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    rounds, spec = run(speculative(model, proposer(model, folder, tok), tok, ids, 24, 3, GREEDY))
    assert spec.token_ids == base.token_ids == module.token_ids
    assert all(len(r.draft_ids) > 0 for r in rounds[1:-1])  # every round after the first drafts
    assert len(calls) >= len(rounds) - 1  # the verifies took the lean path
    assert spec.accepted == module.accepted


def test_gamma_auto_prices_the_named_head(tmp_path, target, monkeypatch):
    """γ = auto's c for method eagle is the named head's measured step, not the shipped head's."""
    from specviz.engine.proposers.eagle import head_cost
    from specviz.engine.trained import store
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(store, "SHIPPED", tmp_path / "shipped")
    folder = write_eagle3(tmp_path / "h", target)[0]
    pair = pair_of(target)
    pair.costs = SimpleNamespace(plain_step_s=2.0)
    c = head_cost(pair, SimpleNamespace(options={"eagle_head": str(folder)}))
    assert c == load_public(pair, str(folder)).step_s / 2.0 > 0
    assert head_cost(pair) is None  # none shipped or trained for this target


@pytest.mark.parametrize("layout", ["eagle1", "eagle3"])
def test_published_heads_on_the_graph_cache_draft_as_on_the_dynamic_one(tmp_path, tok, layout):
    """The graph path (engine/gpu/head.py; graphs off on a CPU): the target's graph cache keeps the states
    a published head reads (EAGLE-3: three layers' inputs), the head runs over its fixed buffer (two
    widths for EAGLE-3: the target's three layers, then its own state), and every round drafts what the
    dynamic cache's run drafts; greedy output is plain's."""
    from specviz.engine.forward import set_cache
    model, graph_model = (tiny_llama(len(tok), layers=8) for _ in range(2))
    assert set_cache(graph_model, "graphs") == "graphs"
    folder = (write_eagle1 if layout == "eagle1" else write_eagle3)(tmp_path / "h", model)[0]
    ids = tok.encode(PROMPT)
    _, base = run(baseline(model, tok, ids, 32, GREEDY))
    ref_rounds, ref = run(speculative(model, proposer(model, folder, tok), tok, ids, 32, 3, GREEDY))
    prop = proposer(graph_model, folder, tok)
    rounds, spec = run(speculative(graph_model, prop, tok, ids, 32, 3, GREEDY))
    assert prop.static is not None and spec.token_ids == base.token_ids == ref.token_ids
    assert spec.drafted > 0 and [r.draft_ids for r in rounds] == [r.draft_ids for r in ref_rounds]
    if layout == "eagle3":
        assert prop.static.widths == (3 * model.config.hidden_size, prop.drafter.head.cfg["hidden"])
