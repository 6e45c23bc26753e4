"""Byte-level BPE tokenizer built from GGUF metadata, matching llama.cpp token for token.

The pipeline mirrors llama.cpp's ``llama_vocab``:

1. special-token partition (``tokenizer_st_partition``): user-defined tokens are always cut
   out of the text, control/unknown tokens only when ``special=True``; longest tokens first;
2. each remaining text fragment is split by llama.cpp's regex list for the ``tokenizer.ggml.pre``
   type, byte-level encoded and BPE-merged (done by HF ``tokenizers``, built from the GGUF
   vocabulary and merges);
3. optional BOS/EOS.

Decoding is the inverse byte-level mapping; control tokens render as nothing unless asked.
"""

from __future__ import annotations

import codecs
import operator

from ..errors import TokenizerError
from .metadata import show

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# --- llama.cpp pre-tokenizer regexes (src/llama-vocab.cpp, llm_tokenizer_bpe) ---------------
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_TAIL = "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
_LLAMA3 = _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}" + _TAIL
_QWEN2 = _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" + _TAIL
_QWEN35 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
           "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_CASED_WORD = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+{c}"
               "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*{c}")

_REGEXES = {
    "default": ["[\\p{P}\\$\\+<=>\\^~\\|]+", _GPT2, "\\p{N}+", "[0-9][0-9][0-9]"],
    "llama3": [_LLAMA3],
    "qwen2": [_QWEN2],
    "qwen35": [_QWEN35],
    "starcoder": ["\\p{N}", _GPT2],
    "gpt2": [_GPT2],
    "falcon": ["[\\p{P}\\$\\+<=>\\^~\\|`]+", _GPT2, "[0-9][0-9][0-9]"],
    "deepseek-coder": ["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"],
    "deepseek-v3": ["\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
                    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"],
    "poro": [" ?[^(\\s|.,!?…。，、।۔،)]+"],
    "gpt4o": [_CASED_WORD.replace("{c}", "(?i:'s|'t|'re|'ve|'m|'ll|'d)?")
              + "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
    "tekken": [_CASED_WORD.replace("{c}", "") + "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
    "seed-coder": [_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"
                   "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
    "superbpe": ["\\p{N}+", "(?=(\\d{3})+(?!\\d))"],
}

# tokenizer.ggml.pre value -> (regex family, ignore_merges, default add_bos)
_PRE_TYPES: dict[str, tuple[str, bool, bool]] = {"default": ("default", False, False)}
for _fam, _flags, _names in (
    ("llama3", (True, True), "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2"),
    ("llama3", (False, False), "dbrx smaug-bpe glm4 chatglm-bpe"),
    ("qwen2", (False, False), "qwen2 deepseek-r1-qwen kormo stablelm2 hunyuan megrez solar-open grok-2"),
    ("qwen35", (False, False), "qwen35"),
    ("starcoder", (False, False), "starcoder refact command-r smollm codeshell exaone minerva-7b"),
    ("gpt2", (False, False), "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum "
                             "modern-bert mpt olmo jais trillion granite-docling exaone4 jina-v1-en "
                             "jina-v2-code roberta-bpe"),
    ("falcon", (False, False), "falcon"),
    ("deepseek-coder", (False, False), "deepseek-coder"),
    ("deepseek-v3", (False, False), "deepseek-v3"),
    ("poro", (False, False), "poro-chat bloom gpt3-finnish"),
    ("gpt4o", (False, False), "gpt-4o llama4 kanana2"),
    ("tekken", (True, True), "tekken"),
    ("seed-coder", (False, False), "seed-coder"),
    ("superbpe", (False, False), "superbpe"),
):
    for _name in _names.split():
        _PRE_TYPES[_name] = (_fam, *_flags)

# Token texts llama.cpp treats as end-of-generation (llama_vocab::impl::load, special_eog_ids).
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>",
))
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_FIM_EOG_TEXTS = (("tokenizer.ggml.fim_pad_token_id", ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
                  ("tokenizer.ggml.fim_rep_token_id",
                   ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
                  ("tokenizer.ggml.fim_sep_token_id", ("<|file_sep|>",)))


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: printable char -> raw byte value."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


# printable byte-level char -> the raw byte it stands for (as a one-char latin-1 string)
_BYTE_TRANSLATION = str.maketrans({c: chr(b) for c, b in _byte_decoder().items()})


class Tokenizer:
    """A GGUF vocabulary as an encoder/decoder; build it with :meth:`from_metadata`."""

    def __init__(self, tokens: list[str], types: list[int], merges: list[str], pre: str,
                 special_ids: dict[str, int | None], add_bos: bool, add_eos: bool, extra_eog: dict):
        from tokenizers import Regex
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models, pre_tokenizers

        if pre not in _PRE_TYPES:
            raise TokenizerError(f"unsupported pre-tokenizer type {show(pre)} (tokenizer.ggml.pre)")
        family, ignore_merges, _ = _PRE_TYPES[pre]
        self.pre = pre
        self.vocab_size = len(tokens)
        self._tokens = tokens
        self._types = list(types)
        vocab = {}
        for i, t in enumerate(tokens):
            if t in vocab:
                raise TokenizerError(f"duplicate token in vocabulary: {show(t)} has ids {vocab[t]} and {i}")
            vocab[t] = i
        self._vocab = vocab
        pairs = []
        for m in merges:
            pos = m.find(" ", 1)
            if pos < 0:
                raise TokenizerError(f"malformed BPE merge {show(m)} (tokenizer.ggml.merges)")
            pairs.append((m[:pos], m[pos + 1:]))
        try:
            model = models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges)
        except Exception as exc:  # tokenizers raises plain Exception on inconsistent merges
            raise TokenizerError(f"GGUF BPE vocabulary is inconsistent: {str(exc).splitlines()[0][:160]}") from None
        hf = HFTokenizer(model)
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in _REGEXES[family]]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        self._hf = hf  # used for the raw-text fragments only; decoding is done here (_raw_bytes)

        def valid(i):
            return i if isinstance(i, int) and 0 <= i < self.vocab_size else None

        self.bos_id = valid(special_ids.get("bos"))
        self.eos_id = valid(special_ids.get("eos"))
        self.add_bos = bool(add_bos)
        self.add_eos = bool(add_eos)
        if self.add_bos and self.bos_id is None:
            raise TokenizerError("tokenizer.ggml.add_bos_token is true, but no valid BOS token id is set")
        self.eog_ids = self._end_of_generation(special_ids, extra_eog)
        # special-token cache: control/unknown/user-defined, longest first (tokenizer_st_partition)
        cache = [i for i, t in enumerate(self._types) if t in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED)]
        cache.sort(key=lambda i: -len(tokens[i].encode("utf-8")))
        self._specials_all = [(tokens[i], i) for i in cache]
        self._specials_user = [(tokens[i], i) for i in cache if self._types[i] == TOKEN_USER_DEFINED]
        self._bytes_cache: dict[int, bytes] = {}  # token id -> raw bytes, filled by _raw_bytes

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_metadata(cls, meta: dict) -> "Tokenizer":
        """Build from a GGUF metadata dict (``GGUFFile(path).metadata``)."""
        model = meta.get("tokenizer.ggml.model")
        if model is None:
            raise TokenizerError("GGUF has no tokenizer (tokenizer.ggml.model missing)")
        if model != "gpt2":
            raise TokenizerError(f"unsupported tokenizer model type {show(model)} (only byte-level BPE 'gpt2' is supported)")
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            raise TokenizerError("GGUF vocabulary is missing or empty (tokenizer.ggml.tokens)")
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        types = meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
        if len(types) < len(tokens):
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None:
            raise TokenizerError("BPE vocabulary without merges (tokenizer.ggml.merges missing)")
        pre = meta.get("tokenizer.ggml.pre") or "default"
        _, _, default_bos = _PRE_TYPES.get(pre, (None, False, False))
        ids = {name: meta.get(f"tokenizer.ggml.{name}_token_id") for name in ("bos", "eos", "eot", "eom")}
        extra = {key: meta.get(key) for key, _ in _FIM_EOG_TEXTS}
        add_bos = meta.get("tokenizer.ggml.add_bos_token", default_bos)
        add_eos = meta.get("tokenizer.ggml.add_eos_token", False)
        return cls(list(tokens), list(types[:len(tokens)]), list(merges), pre, ids, add_bos, add_eos, extra)

    def _end_of_generation(self, ids: dict, extra: dict) -> frozenset:
        """llama.cpp's special_eog_ids; tokens promoted to EOG by text also become control tokens."""
        vocab, n = self._vocab, self.vocab_size
        eog = set()

        def by_text(texts):
            found = [vocab[t] for t in texts if t in vocab]
            return found[0] if found else None

        eot = ids.get("eot") if isinstance(ids.get("eot"), int) and 0 <= ids["eot"] < n else by_text(_EOT_TEXTS)
        eom = ids.get("eom") if isinstance(ids.get("eom"), int) and 0 <= ids["eom"] < n else by_text(("<|eom_id|>",))
        for key, texts in _FIM_EOG_TEXTS:
            tid = extra.get(key)
            tid = tid if isinstance(tid, int) and 0 <= tid < n else by_text(texts)
            if tid is not None:
                eog.add(tid)
        for tid in (eot, eom):
            if tid is not None:
                eog.add(tid)
        eog.update(vocab[t] for t in _EOG_TEXTS if t in vocab)
        for tid in list(eog):
            if self._types[tid] not in (TOKEN_CONTROL, TOKEN_UNUSED):
                self._types[tid] = TOKEN_CONTROL
        texts = {self._tokens[t] for t in eog}
        if "<|end|>" in texts and ({"<|return|>", "<|call|>"} <= texts or {"<|calls|>", "<|flush|>"} <= texts):
            eog.discard(vocab["<|end|>"])  # gpt-oss / solar-open: <|end|> separates messages
            self._types[vocab["<|end|>"]] = TOKEN_USER_DEFINED
        if self.eos_id is not None:
            eog.add(self.eos_id)
        return frozenset(eog)

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str, special: bool = False, add_bos: bool | None = None,
               add_eos: bool | None = None) -> list[int]:
        """Token ids for ``text``; ``special`` parses control-token text (``<|im_start|>``) as tokens."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        ids: list[int] = []
        if self.add_bos if add_bos is None else add_bos:
            if self.bos_id is None:
                raise TokenizerError("this vocabulary has no BOS token")
            ids.append(self.bos_id)
        for piece in self._partition(text, special):
            if isinstance(piece, int):
                ids.append(piece)
            elif piece:
                ids.extend(self._hf.encode(piece, add_special_tokens=False).ids)
        if self.add_eos if add_eos is None else add_eos:
            if self.eos_id is None:
                raise TokenizerError("this vocabulary has no EOS token")
            ids.append(self.eos_id)
        return ids

    def _partition(self, text: str, special: bool) -> list:
        """Cut special-token text out of ``text`` (llama.cpp's tokenizer_st_partition)."""
        fragments: list = [text]
        for tok_text, tok_id in (self._specials_all if special else self._specials_user):
            out = []
            for frag in fragments:
                if isinstance(frag, int) or tok_text not in frag:
                    out.append(frag)
                    continue
                for k, part in enumerate(frag.split(tok_text)):
                    if k:
                        out.append(tok_id)
                    if part:
                        out.append(part)
            fragments = out
        return fragments

    # ------------------------------------------------------------------ decoding
    def _check(self, token_id) -> int:
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            try:
                token_id = operator.index(token_id)  # NumPy integers, not floats or strings
            except TypeError:
                raise TokenizerError(f"token id must be an integer, got {token_id!r}") from None
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"token id {token_id} is outside the vocabulary (0..{self.vocab_size - 1})")
        return token_id

    def _raw_bytes(self, token_id: int) -> bytes:
        """A token's raw bytes (normal: byte-level decoded, user-defined: UTF-8, others empty).

        Worked out per token on first use and memoised: building the table for a 151k-token
        vocabulary up front cost 0.25 s of every start for the handful of tokens a run prints.
        """
        raw = self._bytes_cache.get(token_id)
        if raw is None:
            text, ttype = self._tokens[token_id], self._types[token_id]
            if ttype == TOKEN_NORMAL:
                mapped = text.translate(_BYTE_TRANSLATION)
                try:
                    raw = mapped.encode("latin-1")
                except UnicodeEncodeError:  # a char outside the byte alphabet: keep its UTF-8
                    raw = b"".join(c.encode("latin-1") if ord(c) < 256 else c.encode("utf-8") for c in mapped)
            elif ttype == TOKEN_USER_DEFINED:
                raw = text.encode("utf-8")
            else:
                raw = b""
            self._bytes_cache[token_id] = raw
        return raw

    def token_bytes(self, token_id: int, special: bool = False) -> bytes:
        """Raw bytes of one token; control/unknown tokens give b'' unless ``special``."""
        token_id = self._check(token_id)
        if special and self._types[token_id] in (TOKEN_CONTROL, TOKEN_UNKNOWN):
            return self._tokens[token_id].encode("utf-8")
        return self._raw_bytes(token_id)

    def token_text(self, token_id: int) -> str:
        """The vocabulary string of a token (byte-level alphabet, e.g. 'Ġthe')."""
        return self._tokens[self._check(token_id)]

    def token_type(self, token_id: int) -> int:
        """GGUF token type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)."""
        return self._types[self._check(token_id)]

    def decode(self, ids, special: bool = False) -> str:
        """Text of a token sequence; invalid UTF-8 becomes U+FFFD."""
        return b"".join(self.token_bytes(i, special) for i in ids).decode("utf-8", errors="replace")

    def stream_decoder(self, special: bool = False) -> "StreamDecoder":
        """An incremental decoder that only ever emits complete UTF-8 characters."""
        return StreamDecoder(self, special)


class StreamDecoder:
    """Turns a token stream into text, holding back partial multi-byte UTF-8 sequences."""

    def __init__(self, tokenizer: Tokenizer, special: bool = False):
        self._tokenizer = tokenizer
        self._special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Feed one token; returns the text that became complete (possibly '')."""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id, self._special))

    def flush(self) -> str:
        """Return whatever is pending (an incomplete sequence becomes U+FFFD) and reset."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out
