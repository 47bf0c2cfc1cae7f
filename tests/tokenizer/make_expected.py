#!/usr/bin/env python3
"""Writes tests/tokenizer/expected/*.json: reference ids and decodes from
Hugging Face transformers (AutoTokenizer) for the conformance corpus.

Usage: python tests/tokenizer/make_expected.py   (requirements.txt beside it)

Tokenizers: ../shared/tokenizers/{mistral,llama3,qwen3} (tokenizer.json +
tokenizer_config.json) and the default model's GGUF vocabulary
(~/.cache/osprey/models/SmolLM2-135M-Instruct.Q4_1.gguf, read by transformers'
GGUF converter, gguf_file=).
"""
import json
import os
import random
import sys

from transformers import AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import CORPUS  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.join(REPO, "..", "shared", "tokenizers")
GGUF = os.path.expanduser(os.environ.get("OSPREY_DEFAULT_GGUF", "~/.cache/osprey/models/SmolLM2-135M-Instruct.Q4_1.gguf"))


def sp_vocab_from_mistral():
    """A SentencePiece ("llama") GGUF vocabulary derived from the Mistral
    tokenizer.json: tokens by id, score -id, no merges (so they are derived
    from the scores), types unknown/control/byte/normal, add_bos true. The C++
    test builds the same GgufVocab (conformance_test.cpp, mistral_vocab())."""
    import json as _json
    with open(os.path.join(SHARED, "mistral", "tokenizer.json"), encoding="utf-8") as f:
        vocab = _json.load(f)["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t

    def ttype(t):
        if t == "<unk>":
            return 2
        if t in ("<s>", "</s>"):
            return 3
        if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            return 6
        return 1
    return tokens, [-float(i) for i in range(len(tokens))], [ttype(t) for t in tokens]


def load(name):
    if name == "mistral_sp_gguf":
        import tempfile
        import gguf
        tokens, scores, types = sp_vocab_from_mistral()
        d = tempfile.mkdtemp()
        w = gguf.GGUFWriter(os.path.join(d, "sp.gguf"), arch="llama")
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return AutoTokenizer.from_pretrained(d, gguf_file="sp.gguf")
    if name == "smollm2_gguf":
        return AutoTokenizer.from_pretrained(os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF))
    return AutoTokenizer.from_pretrained(os.path.join(SHARED, name))


def build(name):
    tok = load(name)
    cases = []
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=True)
        ids_plain = tok.encode(text, add_special_tokens=False)
        cases.append({
            "text": text,
            "ids": ids,
            "ids_no_special": ids_plain,
            "decode": tok.decode(ids, skip_special_tokens=False),
            "decode_skip": tok.decode(ids, skip_special_tokens=True),
        })
    # Decodes of arbitrary id sequences: partial UTF-8, specials in the middle.
    rng = random.Random(1234)
    n = len(tok)
    specials = sorted(set(tok.all_special_ids))
    decodes = []
    for k in range(40):
        ids = [rng.randrange(n) for _ in range(rng.randint(1, 10))]
        if specials and k % 3 == 0:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        decodes.append({
            "ids": ids,
            "decode": tok.decode(ids, skip_special_tokens=False),
            "decode_skip": tok.decode(ids, skip_special_tokens=True),
        })
    return {
        "tokenizer": name,
        "vocab_size": n,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "cases": cases,
        "decodes": decodes,
    }


def main():
    out_dir = os.path.join(HERE, "expected")
    os.makedirs(out_dir, exist_ok=True)
    for name in ["smollm2_gguf", "llama3", "qwen3", "mistral", "mistral_sp_gguf"]:
        data = build(name)
        path = os.path.join(out_dir, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=None, separators=(",", ":"))
            f.write("\n")
        print(f"{path}: {len(data['cases'])} cases, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
