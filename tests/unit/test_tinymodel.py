import hashlib
import json
import struct

from transformers import AutoConfig, AutoTokenizer

from inferfleet.lab.tinymodel import generate


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_generated_model_loads_with_transformers(tmp_path):
    model = generate(tmp_path / "m", seed=1)
    config = AutoConfig.from_pretrained(model)
    assert config.model_type == "llama"
    assert config.head_dim == 64  # vLLM's CPU attention refuses 16
    assert (config.num_hidden_layers, config.num_key_value_heads) == (4, 2)

    tok = AutoTokenizer.from_pretrained(model)
    ids = tok("Hello world, the fleet serves.").input_ids
    assert ids and max(ids) < config.vocab_size
    assert tok.decode(ids, skip_special_tokens=True) == "Hello world, the fleet serves."
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|assistant|>\n")


def test_weights_are_bf16_safetensors_of_the_declared_shapes(tmp_path):
    model = generate(tmp_path / "m", seed=1)
    raw = (model / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__")
    config = json.loads((model / "config.json").read_text())
    assert header["model.layers.0.self_attn.k_proj.weight"]["shape"] == [2 * 64, 256]
    assert header["lm_head.weight"]["shape"] == [config["vocab_size"], 256]
    assert {t["dtype"] for t in header.values()} == {"BF16"}
    params = sum(
        t["shape"][0] * (t["shape"][1] if len(t["shape"]) > 1 else 1) for t in header.values()
    )
    assert len(raw) == 8 + n + 2 * params
    assert 2_000_000 < params < 3_000_000


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a = generate(tmp_path / "a", seed=7)
    b = generate(tmp_path / "b", seed=7)
    c = generate(tmp_path / "c", seed=8)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert _digest(a / name) == _digest(b / name)
    assert _digest(a / "model.safetensors") != _digest(c / "model.safetensors")
    assert _digest(a / "tokenizer.json") == _digest(c / "tokenizer.json")
