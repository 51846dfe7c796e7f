"""Per-token log-probabilities of a token sequence under a GGUF model loaded by transformers,
without and with a PEFT LoRA adapter: the reference afkit's exported adapters are checked
against (crates/engine/src/lm/peft_tests.rs).

    python scripts/peft_logprobs.py MODEL.gguf ADAPTER_DIR '[1, 2, 3, ...]'

Prints {"base": [...], "adapted": [...]}: entry i is log p(token i+1 | tokens 0..i).
"""
import json
import os
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def logprobs(model, tokens):
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[i, tokens[i + 1]].item() for i in range(len(tokens) - 1)]


def main():
    gguf, adapter, tokens = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(gguf)),
        gguf_file=os.path.basename(gguf),
        torch_dtype=torch.float32,
    )
    model.eval()
    base = logprobs(model, tokens)
    adapted = logprobs(PeftModel.from_pretrained(model, adapter), tokens)
    print(json.dumps({"base": base, "adapted": adapted}))


if __name__ == "__main__":
    main()
