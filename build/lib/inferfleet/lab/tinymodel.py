"""Generate a tiny random-weight Llama that vLLM's CPU build can serve.

Deterministic from a seed: the same seed gives byte-identical files, a different seed
gives different weights (and so different greedy output), which is what tests of
rollouts need. Written with numpy and `tokenizers` only (no torch): weights are bf16 in
a safetensors file, the tokenizer a 512-token byte-level BPE trained on a fixed text.
head_dim is 64 because vLLM's CPU attention refuses 16.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
VOCAB_SIZE = 512
MAX_POSITIONS = 2048
SPECIAL = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog while the fleet serves every request.",
    "Inference nodes hold the whole model; the load balancer spreads requests evenly.",
    "A pipeline instance spans several nodes when the model cannot fit on one machine.",
    "Weights are verified by their SHA-256 before the current version switches.",
    "Hello world. How are you today? I am fine, thank you, and the answer is 42.",
    "def main():\n    return sum(range(10))\n",
    "user assistant system: please answer briefly and precisely, in plain words.",
]


def _bf16_bytes(values: np.ndarray) -> bytes:
    """Round float32 to bfloat16 (nearest even) and return the raw little-endian bytes."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16).tobytes()


def _tensors(shape: dict, vocab: int, seed: int) -> dict[str, tuple[list[int], bytes]]:
    rng = np.random.default_rng(seed)
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = hidden // heads

    def normal(*dims: int) -> tuple[list[int], bytes]:
        return list(dims), _bf16_bytes(rng.normal(0.0, 0.05, size=dims))

    def ones(n: int) -> tuple[list[int], bytes]:
        return [n], _bf16_bytes(np.ones(n))

    out = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = normal(heads * head_dim, hidden)
        out[p + "self_attn.k_proj.weight"] = normal(kv_heads * head_dim, hidden)
        out[p + "self_attn.v_proj.weight"] = normal(kv_heads * head_dim, hidden)
        out[p + "self_attn.o_proj.weight"] = normal(hidden, heads * head_dim)
        out[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        out[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        out[p + "mlp.down_proj.weight"] = normal(hidden, inter)
        out[p + "input_layernorm.weight"] = ones(hidden)
        out[p + "post_attention_layernorm.weight"] = ones(hidden)
    out["model.norm.weight"] = ones(hidden)
    out["lm_head.weight"] = normal(vocab, hidden)
    return out


def write_safetensors(path: Path, tensors: dict[str, tuple[list[int], bytes]]) -> None:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        dims, data = tensors[name]
        header[name] = {
            "dtype": "BF16",
            "shape": dims,
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in sorted(tensors):
            f.write(tensors[name][1])


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    return tok


def generate(out: Path, seed: int = 0, shape: dict | None = None) -> Path:
    """Write the model into `out` (created) and return it."""
    shape = {**SHAPE, **(shape or {})}
    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer()
    vocab = tok.get_vocab_size()
    tok.save(str(out / "tokenizer.json"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **shape,
        "head_dim": shape["hidden_size"] // shape["num_attention_heads"],
        "vocab_size": vocab,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": SPECIAL.index("<s>"),
        "eos_token_id": SPECIAL.index("</s>"),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps(
            {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
            indent=2,
        )
        + "\n"
    )
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": MAX_POSITIONS,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    write_safetensors(out / "model.safetensors", _tensors(shape, vocab, seed))
    return out


if __name__ == "__main__":
    import sys

    print(generate(Path(sys.argv[1]), seed=int(sys.argv[2]) if len(sys.argv) > 2 else 0))
