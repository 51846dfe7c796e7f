#!/usr/bin/env python3
"""Reference outputs of Gemma-3-270M (the Q4_K_M GGUF that `afkit models fetch gemma3` fetches)
from Hugging Face transformers, for afkit's tests of its Gemma 3 forward pass and tokenizer.

transformers reads the GGUF itself (`gguf_file=`), dequantises every weight to f32 and runs its
own Gemma 3 code in f32, so it shares no code with afkit's engine. Writes JSON with, per text,
the token ids the reference tokenizer gives (without <bos>) and the log-probability of each
token given <bos> and the tokens before it.

    python3 -m pip install torch transformers gguf sentencepiece
    python3 scripts/gemma3_reference.py "$AFKIT_HOME/models/gemma3/gemma-3-270m-q4_k_m.gguf" \
        crates/engine/testdata/gemma3_270m_reference.json
"""

import hashlib
import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

# Captions like the ones afkit scores, plus digits, punctuation, accents, a double space and a
# newline for the tokenizer.
TEXTS = [
    "A man is standing on a ladder cleaning the windows of a house.",
    "The woman puts the dough into the oven and closes the door.",
    "Two kids are playing soccer in a park while their parents watch from a bench.",
    "He picks up the guitar, tunes it and starts to play a song.",
    "In 1998, 3 friends opened a café near Zürich; it's still open!",
    "She said:  \"we'll see\"\nthen left.",
]


def main() -> None:
    gguf = Path(sys.argv[1])
    out = Path(sys.argv[2])
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    model.eval()
    cases = []
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False).input_ids
        full = [tok.bos_token_id] + ids
        with torch.no_grad():
            logits = model(torch.tensor([full])).logits[0].double()
        logprobs = torch.log_softmax(logits, dim=-1)
        token_logprobs = [logprobs[i, full[i + 1]].item() for i in range(len(ids))]
        cases.append({"text": text, "ids": ids, "logprobs": token_logprobs})
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    record = {
        "model_sha256": sha,
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, f32",
        "bos": tok.bos_token_id,
        "cases": cases,
    }
    out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
