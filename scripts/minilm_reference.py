#!/usr/bin/env python3
"""An independent NumPy implementation of all-MiniLM-L6-v2 sentence embeddings (BERT forward
pass, mean pooling over the attention mask, L2 normalisation, 256 word pieces), to check afkit's
candle encoder: compares with the vectors afkit wrote (`afkit aflite --write-features X.npy`)
for the first N texts of the same JSONL input ({"text": ...}). Prints one JSON object.

Needs: numpy, scipy, tokenizers, safetensors (all small wheels from PyPI).
Usage: minilm_reference.py MODEL_DIR DATA.jsonl X.npy [N]
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file
from scipy.special import erf
from tokenizers import Tokenizer

model_dir, data, features = sys.argv[1], sys.argv[2], sys.argv[3]
n = int(sys.argv[4]) if len(sys.argv) > 4 else 50
w = load_file(f"{model_dir}/model.safetensors")
cfg = json.load(open(f"{model_dir}/config.json"))
tok = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
tok.enable_truncation(256)
tok.no_padding()
heads, layers, eps = cfg["num_attention_heads"], cfg["num_hidden_layers"], cfg["layer_norm_eps"]


def layer_norm(x, name):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]


def dense(x, name):
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


def embed(text):
    ids = np.array(tok.encode(text).ids)
    h = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][: len(ids)] \
        + w["embeddings.token_type_embeddings.weight"][0]
    h = layer_norm(h.astype(np.float64), "embeddings.LayerNorm")
    d = h.shape[1] // heads
    for l in range(layers):
        p = f"encoder.layer.{l}"
        q, k, v = (dense(h, f"{p}.attention.self.{m}").reshape(len(ids), heads, d).transpose(1, 0, 2)
                   for m in ("query", "key", "value"))
        a = q @ k.transpose(0, 2, 1) / np.sqrt(d)
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        ctx = (a @ v).transpose(1, 0, 2).reshape(len(ids), -1)
        h = layer_norm(h + dense(ctx, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
        inter = dense(h, f"{p}.intermediate.dense")
        inter = 0.5 * inter * (1 + erf(inter / np.sqrt(2)))
        h = layer_norm(h + dense(inter, f"{p}.output.dense"), f"{p}.output.LayerNorm")
    u = h.mean(0)
    return u / max(np.linalg.norm(u), 1e-12)


texts = []
with open(data) as f:
    for line in f:
        texts.append(json.loads(line)["text"])
        if len(texts) == n:
            break
ours = np.load(features)[: len(texts)]
ref = np.stack([embed(t) for t in texts])
cos = (ref * ours).sum(1) / np.linalg.norm(ours, axis=1)
print(json.dumps({"texts": len(texts), "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()),
                  "max_abs_diff": float(np.abs(ref - ours).max())}))
