"""A tiny random-weight llama model with a real BPE tokenizer, made locally (no model hub, no downloads).

What it makes, deterministically from a seed:

- a byte-level BPE tokenizer (GPT-2 style: ByteLevel pre-tokenizer with the GPT-2 regex, so llama.cpp's
  ``gpt2`` tokenizer with pre-tokenizer ``gpt-2`` splits text the same way) trained with the
  ``tokenizers`` package on English-like text generated here (a fixed paragraph plus seeded
  pseudo-English sentences). Special tokens (ids 0-2): ``<|endoftext|>`` (BOS), ``<|im_start|>``,
  ``<|im_end|>`` (EOS, end of a chat turn). Saved as ``tokenizer/tokenizer.json`` (+
  ``tokenizer_config.json`` with the chat template), loadable by ``tokenizers.Tokenizer.from_file``
  and ``transformers.AutoTokenizer.from_pretrained``;
- ``model.gguf``: a llama-architecture GGUF (4 layers, hidden 128) with that vocabulary, the BPE
  merges and a ChatML chat template, random weights;
- ``draft.gguf``: an even smaller one (1 layer, hidden 64) with the same vocabulary, usable as the
  draft model for speculative decoding.

Random weights generate random tokens; ``ignore_eos: true`` in a request makes llama.cpp mask every
end-of-generation token so a request returns exactly ``max_tokens`` tokens.

Outputs are cached in ``<cache>/tiny-models-<hash>/`` (the cache root of ``tests.real.llamacpp``),
keyed by a hash of the generator parameters and of this file, built in a temporary directory and
renamed into place.

Usage::

    python -m tests.real.tinymodel          # make (or find) the models, print their paths as JSON
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import random
import sys
from pathlib import Path

from tests.real.llamacpp import cache_lock, cache_root, staged

BOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [BOS, IM_START, IM_END]

# ChatML, as Qwen-style models use it (no system prompt injected, no BOS).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int


@dataclasses.dataclass(frozen=True)
class Params:
    seed: int = 1234
    vocab_size: int = 4096
    corpus_sentences: int = 30000
    n_ctx_train: int = 16384
    target: ModelShape = ModelShape(n_embd=128, n_layer=4, n_head=4, n_head_kv=4, n_ff=256)
    draft: ModelShape = ModelShape(n_embd=64, n_layer=1, n_head=2, n_head_kv=2, n_ff=128)
    init_std: float = 0.02

    def key(self) -> str:
        src = Path(__file__).read_bytes()
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode() + b"\0" + src
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class TinyModels:
    """Paths and facts of one generated set (also stored as ``info.json`` next to the files)."""

    dir: Path
    model: Path  # target GGUF
    draft: Path  # draft GGUF, same vocabulary
    tokenizer_dir: Path  # tokenizer.json + tokenizer_config.json + special_tokens_map.json
    tokenizer_json: Path
    n_vocab: int
    n_ctx_train: int
    special_ids: tuple[int, ...]  # ids of the special (control) tokens
    bos_id: int
    eos_id: int
    first_normal_id: int  # every id in [first_normal_id, n_vocab) is an ordinary (non-special) token
    chat_template: str

    @classmethod
    def load(cls, d: Path) -> TinyModels:
        info = json.loads((d / "info.json").read_text())
        return cls(
            dir=d,
            model=d / "model.gguf",
            draft=d / "draft.gguf",
            tokenizer_dir=d / "tokenizer",
            tokenizer_json=d / "tokenizer" / "tokenizer.json",
            n_vocab=info["n_vocab"],
            n_ctx_train=info["n_ctx_train"],
            special_ids=tuple(info["special_ids"]),
            bos_id=info["bos_id"],
            eos_id=info["eos_id"],
            first_normal_id=info["first_normal_id"],
            chat_template=info["chat_template"],
        )


# --------------------------------------------------------------------------------------------- text

PARAGRAPH = (
    "A load test sends many requests to a server at the same time and measures how long each one "
    "takes. The first token arrives after the prompt has been read; the next tokens follow one by "
    "one, and the time between them tells how fast the server decodes. When more users arrive than "
    "the server can run at once, the extra requests wait in a queue, and the time to the first token "
    "grows while the decoding speed of the running requests stays almost the same. Speculative "
    "decoding lets a small draft model guess several tokens ahead; the large model checks the guesses "
    "in one step and keeps the ones it agrees with. If most guesses are right, each step yields more "
    "than one token and the answer comes back sooner. If the server is already busy, the extra work "
    "of checking the guesses can cost more than it saves. "
)

COMMON_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "it",
    "you",
    "that",
    "he",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "I",
    "his",
    "they",
    "be",
    "at",
    "one",
    "have",
    "this",
    "from",
    "or",
    "had",
    "by",
    "hot",
    "word",
    "but",
    "what",
    "some",
    "we",
    "can",
    "out",
    "other",
    "were",
    "all",
    "there",
    "when",
    "up",
    "use",
    "your",
    "how",
    "said",
    "an",
    "each",
    "she",
    "which",
    "do",
    "their",
    "time",
    "if",
    "will",
    "way",
    "about",
    "many",
    "then",
    "them",
    "write",
    "would",
    "like",
    "so",
    "these",
    "her",
    "long",
    "make",
    "thing",
    "see",
    "him",
    "two",
    "has",
    "look",
    "more",
    "day",
    "could",
    "go",
    "come",
    "did",
    "number",
    "sound",
    "no",
    "most",
    "people",
    "my",
    "over",
    "know",
    "water",
    "than",
    "call",
    "first",
    "who",
    "may",
    "down",
    "side",
    "been",
    "now",
    "find",
    "any",
    "new",
    "work",
    "part",
    "take",
    "get",
    "place",
    "made",
    "live",
    "where",
    "after",
    "back",
    "little",
    "only",
    "round",
    "man",
    "year",
    "came",
    "show",
    "every",
    "good",
    "me",
    "give",
    "our",
    "under",
    "name",
    "very",
    "through",
    "just",
    "form",
    "sentence",
    "great",
    "think",
    "say",
    "help",
    "low",
    "line",
    "differ",
    "turn",
    "cause",
    "much",
    "mean",
    "before",
    "move",
    "right",
    "boy",
    "old",
    "too",
    "same",
    "tell",
    "does",
    "set",
    "three",
    "want",
    "air",
    "well",
    "also",
    "play",
    "small",
    "end",
    "put",
    "home",
    "read",
    "hand",
    "port",
    "large",
    "spell",
    "add",
    "even",
    "land",
    "here",
    "must",
    "big",
    "high",
    "such",
    "follow",
    "act",
    "why",
    "ask",
    "men",
    "change",
    "went",
    "light",
    "kind",
    "off",
    "need",
    "house",
    "picture",
    "try",
    "us",
    "again",
    "animal",
    "point",
    "mother",
    "world",
    "near",
    "build",
    "self",
    "earth",
    "father",
    "head",
    "stand",
    "own",
    "page",
    "should",
    "country",
    "found",
    "answer",
    "school",
    "grow",
    "study",
    "still",
    "learn",
    "plant",
    "cover",
    "food",
    "sun",
    "four",
    "between",
    "state",
    "keep",
    "eye",
    "never",
    "last",
    "let",
    "thought",
    "city",
    "tree",
    "cross",
    "farm",
    "hard",
    "start",
    "might",
    "story",
    "saw",
    "far",
    "sea",
    "draw",
    "left",
    "late",
    "run",
    "while",
    "press",
    "close",
    "night",
    "real",
    "life",
    "few",
    "north",
    "open",
    "seem",
    "together",
    "next",
    "white",
    "children",
    "begin",
    "got",
    "walk",
    "example",
    "ease",
    "paper",
    "group",
    "always",
    "music",
    "those",
    "both",
    "mark",
    "often",
    "letter",
    "until",
    "mile",
    "river",
    "car",
    "feet",
    "care",
    "second",
    "book",
    "carry",
    "took",
    "science",
    "eat",
    "room",
    "friend",
    "began",
    "idea",
    "fish",
    "mountain",
    "stop",
    "once",
    "base",
    "hear",
    "horse",
    "cut",
    "sure",
    "watch",
    "color",
    "face",
    "wood",
    "main",
    "enough",
    "plain",
    "girl",
    "usual",
    "young",
    "ready",
    "above",
    "ever",
    "red",
    "list",
    "though",
    "feel",
    "talk",
    "bird",
    "soon",
    "body",
    "dog",
    "family",
    "direct",
    "pose",
    "leave",
    "song",
    "measure",
    "door",
    "product",
    "black",
    "short",
    "numeral",
    "class",
    "wind",
    "question",
    "happen",
    "complete",
    "ship",
    "area",
    "half",
    "rock",
    "order",
    "fire",
    "south",
    "problem",
    "piece",
    "told",
    "knew",
    "pass",
    "since",
    "top",
    "whole",
    "king",
    "space",
    "heard",
    "best",
    "hour",
    "better",
    "true",
    "during",
    "hundred",
    "five",
    "remember",
    "step",
    "early",
    "hold",
    "west",
    "ground",
    "interest",
    "reach",
    "fast",
    "verb",
    "sing",
    "listen",
    "six",
    "table",
    "travel",
    "less",
    "morning",
    "ten",
    "simple",
    "several",
    "vowel",
    "toward",
    "war",
    "lay",
    "against",
    "pattern",
    "slow",
    "center",
    "love",
    "person",
    "money",
    "serve",
    "appear",
    "road",
    "map",
    "rain",
    "rule",
    "govern",
    "pull",
    "cold",
    "notice",
    "voice",
    "unit",
    "power",
    "town",
    "fine",
    "certain",
    "fly",
    "fall",
    "lead",
    "cry",
    "dark",
    "machine",
    "note",
    "wait",
    "plan",
    "figure",
    "star",
    "box",
    "noun",
    "field",
    "rest",
    "correct",
    "able",
    "pound",
    "done",
    "beauty",
    "drive",
    "stood",
    "contain",
    "front",
    "teach",
    "week",
    "final",
    "gave",
    "green",
    "oh",
    "quick",
    "develop",
    "ocean",
    "warm",
    "free",
    "minute",
    "strong",
    "special",
    "mind",
    "behind",
    "clear",
    "tail",
    "produce",
    "fact",
    "street",
    "inch",
    "multiply",
    "nothing",
    "course",
    "stay",
    "wheel",
    "full",
    "force",
    "blue",
    "object",
    "decide",
    "surface",
    "deep",
    "moon",
    "island",
    "foot",
    "system",
    "busy",
    "test",
    "record",
    "boat",
    "common",
    "gold",
    "possible",
    "plane",
    "stead",
    "dry",
    "wonder",
    "laugh",
    "thousand",
    "ago",
    "ran",
    "check",
    "game",
    "shape",
    "equate",
    "miss",
    "brought",
    "heat",
    "snow",
    "tire",
    "bring",
    "yes",
    "distant",
    "fill",
    "east",
    "paint",
    "language",
    "among",
    "server",
    "token",
    "request",
    "model",
    "queue",
    "latency",
    "throughput",
    "draft",
    "accept",
    "batch",
    "prompt",
    "speed",
]

ONSETS = [
    "",
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "j",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "y",
    "z",
    "br",
    "cl",
    "st",
    "tr",
    "ch",
    "sh",
    "th",
    "pl",
    "gr",
    "fr",
    "sp",
    "qu",
    "wh",
    "dr",
]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io", "ee", "oo", "y"]
CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ck", "ng", "rt", "ss", "x"]


def _pseudo_word(rng: random.Random) -> str:
    n = rng.choices([1, 2, 3, 4], weights=[3, 5, 3, 1])[0]
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(n))


def make_corpus(seed: int, n_sentences: int) -> list[str]:
    """Deterministic English-like text, one paragraph per list item (ASCII only)."""
    rng = random.Random(seed)
    lexicon = list(dict.fromkeys(COMMON_WORDS + [_pseudo_word(rng) for _ in range(12000)]))
    # Zipf-like weights: frequent words first (the real ones), a long tail of pseudo-words
    cum: list[float] = list(itertools.accumulate(1.0 / (i + 1) ** 0.9 for i in range(len(lexicon))))
    paragraphs: list[str] = [PARAGRAPH] * 20
    sentences: list[str] = []
    for _ in range(n_sentences):
        n = rng.randint(4, 18)
        words = rng.choices(lexicon, cum_weights=cum, k=n)
        out = []
        for i, w in enumerate(words):
            r = rng.random()
            if r < 0.03:
                w = str(rng.choice([rng.randint(0, 99), rng.randint(100, 9999), rng.randint(1900, 2030)]))
            elif r < 0.04:
                w = f"{rng.randint(0, 999)}.{rng.randint(0, 99):02d}"
            elif r < 0.05:
                w = f'"{w}"'
            elif r < 0.06:
                w = f"({w})"
            elif r < 0.08:
                w = w.capitalize()
            if i == 0:
                w = w[:1].upper() + w[1:]
            out.append(w)
            if i < n - 1 and rng.random() < 0.08:
                out[-1] += rng.choice([",", ",", ";", ":"])
        s = " ".join(out) + rng.choice([".", ".", ".", ".", "?", "!"])
        if rng.random() < 0.05:
            s = f"{rng.randint(1, 20)}. {s}"
        sentences.append(s)
        if rng.random() < 0.12:
            paragraphs.append(" ".join(sentences))
            sentences = []
    if sentences:
        paragraphs.append(" ".join(sentences))
    return paragraphs


# ---------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(p: Params, out_dir: Path) -> dict:
    """Train the BPE tokenizer, save tokenizer.json & co in out_dir; return its parsed tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=p.vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(make_corpus(p.seed, p.corpus_sentences), trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": IM_END,
        "pad_token": BOS,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": p.n_ctx_train,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": IM_END, "pad_token": BOS}, indent=2) + "\n"
    )
    return json.loads((out_dir / "tokenizer.json").read_text())


# --------------------------------------------------------------------------------------------- GGUF


def write_gguf(path: Path, tj: dict, p: Params, shape: ModelShape, seed: int, name: str) -> None:
    import gguf
    import numpy as np

    vocab: dict[str, int] = tj["model"]["vocab"]
    n_vocab = len(vocab)
    tokens = [""] * n_vocab
    for t, i in vocab.items():
        tokens[i] = t
    special = {a["id"] for a in tj["added_tokens"] if a.get("special")}
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(n_vocab)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]

    head_dim = shape.n_embd // shape.n_head
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(p.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab[BOS])
    w.add_eos_token_id(vocab[IM_END])
    w.add_pad_token_id(vocab[BOS])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:  # numpy (rows, cols) = ggml ne (cols, rows)
        return (rng.standard_normal((rows, cols)) * p.init_std).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    n_kv = head_dim * shape.n_head_kv
    w.add_tensor("token_embd.weight", mat(n_vocab, shape.n_embd))
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones(shape.n_embd))
        w.add_tensor(b + "attn_q.weight", mat(shape.n_embd, shape.n_embd))
        w.add_tensor(b + "attn_k.weight", mat(n_kv, shape.n_embd))
        w.add_tensor(b + "attn_v.weight", mat(n_kv, shape.n_embd))
        w.add_tensor(b + "attn_output.weight", mat(shape.n_embd, shape.n_embd))
        w.add_tensor(b + "ffn_norm.weight", ones(shape.n_embd))
        w.add_tensor(b + "ffn_gate.weight", mat(shape.n_ff, shape.n_embd))
        w.add_tensor(b + "ffn_up.weight", mat(shape.n_ff, shape.n_embd))
        w.add_tensor(b + "ffn_down.weight", mat(shape.n_embd, shape.n_ff))
    w.add_tensor("output_norm.weight", ones(shape.n_embd))
    w.add_tensor("output.weight", mat(n_vocab, shape.n_embd))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# -------------------------------------------------------------------------------------------- cache


def models_dir(p: Params | None = None) -> Path:
    return cache_root() / f"tiny-models-{(p or Params()).key()}"


def make(p: Params | None = None) -> TinyModels:
    """Return the tiny models for these parameters, generating them unless cached."""
    p = p or Params()
    final = models_dir(p)
    if (final / "info.json").is_file():
        return TinyModels.load(final)
    root = cache_root()
    with cache_lock(root, "tiny-models", "the tiny models"):
        if (final / "info.json").is_file():
            return TinyModels.load(final)
        with staged(root, ".build-tiny-models-", final) as work:
            tj = train_tokenizer(p, work / "tokenizer")
            vocab = tj["model"]["vocab"]
            special_ids = sorted(a["id"] for a in tj["added_tokens"] if a.get("special"))
            write_gguf(work / "model.gguf", tj, p, p.target, p.seed + 1, "specload-tiny")
            write_gguf(work / "draft.gguf", tj, p, p.draft, p.seed + 2, "specload-tiny-draft")
            info = {
                "params": dataclasses.asdict(p),
                "key": p.key(),
                "n_vocab": len(vocab),
                "n_merges": len(tj["model"]["merges"]),
                "n_ctx_train": p.n_ctx_train,
                "special_ids": special_ids,
                "special_tokens": {t: vocab[t] for t in SPECIAL_TOKENS},
                "bos_id": vocab[BOS],
                "eos_id": vocab[IM_END],
                "first_normal_id": max(special_ids) + 1,
                "chat_template": CHAT_TEMPLATE,
            }
            (work / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    return TinyModels.load(final)


def main() -> int:
    m = make()
    out = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(m).items()}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
