#!/usr/bin/env python3
"""The peer for `afkit generate`'s benchmark: llama.cpp through llama-cpp-python, same GGUF,
same contexts (read from an afkit project), same job — N unique endings per context, sampled one
completion per call with the sampler pinned to plain ancestral sampling (temperature 1, top_p 1,
top_k 0, min_p 0, no repetition penalty), stopping at sentence end, EOS or a token cap.

The prompt is given as token ids, `<|endoftext|>` + the context, exactly as afkit prompts.
llama-cpp-python keeps the KV cache of the common prefix between calls, so each context is
prefilled once, like afkit does.

Prints one JSON object: contexts, endings, draws, tokens, seconds, endings/s, tokens/s.
"""
import argparse
import json
import sqlite3
import time

from llama_cpp import Llama, StoppingCriteriaList


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--project", required=True, help="afkit project with ingested examples")
    ap.add_argument("--model", required=True, help="the GGUF file")
    ap.add_argument("--limit", type=int, default=200, help="contexts (the first by example id)")
    ap.add_argument("--n-neg", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--max-words", type=int, default=25)
    ap.add_argument("--max-draws-per-ending", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    db = sqlite3.connect(args.project)
    rows = db.execute(
        "SELECT ext_id, sent1, sent2, ending FROM examples ORDER BY id LIMIT ?", (args.limit,)
    ).fetchall()
    llm = Llama(
        model_path=args.model,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_ctx=512,
        n_batch=512,
        logits_all=False,
        verbose=False,
    )
    doc_start = llm.tokenize(b"<|endoftext|>", add_bos=False, special=True)
    # afkit's stop rule: a token whose text ends with . ! or ? ends the ending (kept in it).
    ends_sentence = [
        llm.detokenize([i]).endswith((b".", b"!", b"?")) for i in range(llm.n_vocab())
    ]
    stop_at_sentence_end = StoppingCriteriaList([lambda ids, logits: ends_sentence[ids[-1]]])

    endings = draws = tokens = 0
    start = time.perf_counter()
    for i, (ext_id, sent1, sent2, gold) in enumerate(rows):
        startphrase = f"{sent1} {sent2}" if sent2 else sent1
        prompt = doc_start + llm.tokenize(startphrase.encode(), add_bos=False, special=False)
        seen = {" ".join(gold.split())}
        kept = 0
        context_draws = 0
        while kept < args.n_neg and context_draws < args.n_neg * args.max_draws_per_ending:
            out = llm.create_completion(
                prompt,
                max_tokens=args.max_tokens,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                min_p=0.0,
                typical_p=1.0,
                repeat_penalty=1.0,
                frequency_penalty=0.0,
                presence_penalty=0.0,
                stopping_criteria=stop_at_sentence_end,
                seed=args.seed * 1_000_003 + i * 10_007 + context_draws,
            )
            context_draws += 1
            choice = out["choices"][0]
            tokens += out["usage"]["completion_tokens"]
            text = " ".join(choice["text"].split())
            # Rows cut by the token cap or ended by EOS are not whole sentences: dropped, as afkit does.
            if not text.endswith((".", "!", "?")):
                continue
            if len(text.split()) <= args.max_words and text not in seen:
                seen.add(text)
                kept += 1
        endings += kept
        draws += context_draws
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "peer": "llama-cpp-python",
                "contexts": len(rows),
                "endings": endings,
                "draws": draws,
                "tokens_generated": tokens,
                "seconds": seconds,
                "endings_per_second": endings / seconds,
                "tokens_per_second": tokens / seconds,
                "threads": args.threads,
            }
        )
    )


if __name__ == "__main__":
    main()
