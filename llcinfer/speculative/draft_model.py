"""A smaller model of the same vocabulary drafts for the target.

Each request gets a sequence in the draft model's own KV pool, kept in step with the
request's tokens (what the target rejected is truncated away at the next proposal).  One
proposal runs ``depth`` draft steps for every drafting request at once: the first
catches the sequence up (the tokens the target accepted since), each next one feeds the
previous draft token.  The steps run on the draft's own DecodeExecutor sharing the
target's worker threads (``use_executor``) where the draft model allows it, else as
batched forwards.  The draft's LM head computes the first ``HEAD_ROWS`` token ids only
(FR-Spec's frequency-ranked draft vocabulary, arXiv 2502.14856; byte-pair vocabularies
number their tokens in merge order, so the frequent tokens come first): the head of a
large vocabulary is a good part of a small model's weights, and a token the draft cannot
propose costs an acceptance at most, never correctness.  Drafts are greedy (the draft's
top-1), so the tree is deterministic and the acceptance walk stays lossless; the root
also gets the draft's next-best tokens as siblings.  A node's confidence is the draft's
probability of its path (product of the draft's softmax probabilities along it).

Staged drafting (Spector and Re, arXiv 2308.04623): the draft model's own steps are
speculated by prompt lookup.  Where the request's last tokens occur earlier in its prompt
or output (``NgramDrafter``, matches of at least ``GUESS_MIN_MATCH`` tokens), the
continuation found there rides in the proposal's first draft step as extra rows, and the
draft's chain takes each guessed token its own top-1 agrees with, from one forward, before
it steps token by token from the first disagreement (the guessed rows after it are
truncated away).  The chain is what the draft model would have drafted alone, only longer
for the same draft steps where the answer copies text.

Copying: where the request's text repeats (its last ``REPEAT_MATCH`` tokens occur earlier
in its prompt or output, ``guesses``), the lookup's continuation goes to verification as
it is (cut before a token outside the draft's head), with the lookup's confidences, and
the draft model does not run: checking a copied continuation cost a draft forward of up
to 16 rows (a third of a code edit's verifying step with the 0.5B drafting for the 1.5B)
to confirm what the target then accepted anyway.  The
draft sequence falls behind meanwhile and reads what it missed at its next proposal, in
one batched forward (``catch_up_s`` prices it), or never, where the request ends while
copying.
"""

from __future__ import annotations

import time

import numpy as np

from ..dtypes import KV_F16, KV_F32
from ..errors import UsageError
from ..executor import DecodeExecutor, unsupported_reason
from ..kv import PagedSequence
from .lookup import NgramDrafter
from .tree import DraftTree

_SIBLINGS = 2  # extra root children: the draft's 2nd and 3rd choices
STEP_EMA = 0.3  # weight of the newest timed draft step in step_s
_MIN_CONF = 0.02  # a chain stops growing below this path confidence (see min_conf)
_EXECUTOR_ROWS = 16  # longest catch-up a draft step runs on the executor
HEAD_ROWS = 65536  # token ids the draft's LM head covers (the first ones)
_PRICED_ROWS = 64  # a forward of at least this many tokens times row_s (fewer: the weight stream dominates)
GUESS_MIN_MATCH = 2  # shortest match of the request's last tokens whose continuation is guessed
REPEAT_MATCH = 8  # a match this long: the request's text repeats (``guesses``); the longest looked up


def check_draft_compatible(draft_cfg, target_cfg, draft_vocab: list[str], target_vocab: list[str],
                           draft_bytes: int, target_bytes: int, draft_name: str) -> None:
    """One-line UsageError when ``draft_name`` cannot draft for the target."""
    if draft_cfg.vocab_size != target_cfg.vocab_size or draft_vocab != target_vocab:
        raise UsageError(f"draft model {draft_name} does not share the target's vocabulary "
                         f"({draft_cfg.vocab_size} vs {target_cfg.vocab_size} tokens)")
    if draft_bytes >= target_bytes:
        raise UsageError(f"draft model {draft_name} ({draft_bytes / 2**20:.0f} MiB) is not smaller than the target "
                         f"({target_bytes / 2**20:.0f} MiB)")


def _top(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely token ids of a logits ``row``  # [vocab], most likely first, and
    their softmax probabilities: p_i = exp(l_i - max l) / sum_j exp(l_j - max l)."""
    if k == 1:
        ids = np.array([int(np.argmax(row))])
    else:
        ids = np.argpartition(row, -k)[-k:]
        ids = ids[np.argsort(-row[ids], kind="stable")]
    top = row[ids[0]]
    z = float(np.exp(row - top, dtype=np.float32).sum(dtype=np.float64))
    return ids, np.exp((row[ids] - top).astype(np.float64)) / z


def _within_head(tree: DraftTree, head_rows: int) -> DraftTree:
    """``tree`` without its nodes of token ids from ``head_rows`` on and their subtrees:
    what the drafter proposes stays within its head, copies too."""
    keep = tree.tokens < head_rows  # [n]
    if keep.all():
        return tree
    for i, p in enumerate(tree.parents.tolist()):  # parents come first
        if p >= 0 and not keep[p]:
            keep[i] = False
    return tree.subset(keep)


class DraftModelDrafter:
    name = "draft"

    def __init__(self, model, n_ctx: int, n_seq: int, depth: int = 6):
        self.model = model  # a Transformer: forward_chunks, new_pool
        self.depth = depth
        self.min_conf = _MIN_CONF  # path confidence below which drafting one more token costs more than it gains
        self.step_s = 0.0  # seconds of one draft step of one sequence: priced, then timed (STEP_EMA)
        self._decode_s = self._slope_s = 0.0  # the target's decode step and row slope (min_conf)
        self.n_ctx = n_ctx
        self.pool, self.prefix = model.new_pool(n_ctx, n_seq, None, prefix_sharing=False)
        self._seqs: dict[object, object] = {}  # request key -> its PagedSequence in the draft pool
        self.executor: DecodeExecutor | None = None
        self.head_rows = min(HEAD_ROWS, model.config.vocab_size)  # draft tokens are ids below this
        self.row_s = 0.0  # seconds per token of the last batched forward of _PRICED_ROWS or more (0: not yet timed)
        self.read_s = 0.0  # seconds the last proposal spent in batched forwards: long catch-ups
        self.lookup = NgramDrafter(max_match=REPEAT_MATCH, min_match=GUESS_MIN_MATCH)  # guesses (staged drafting)
        self.copied: set = set()  # request keys whose last proposal was a copy (module doc)

    def use_executor(self, target_executor: DecodeExecutor) -> bool:
        """Run the draft steps on the target executor's domains and threads; False (batched
        forwards stay) when the draft model or its KV pool cannot run on an executor."""
        if unsupported_reason(self.model) is not None or self.pool.kind not in (KV_F16, KV_F32):
            return False
        self.executor = DecodeExecutor(self.model, target_executor.domains, workers=target_executor.workers,
                                       head_rows=self.head_rows)
        return True

    def price(self, decode_s: float, slope_s: float, target_bytes: int) -> None:
        """Stop drafting where the next token's path confidence no longer pays for its draft
        step and its verification row: min_conf = (draft step + slope) / target decode
        step.  The draft step is priced here as the target's decode step scaled by the
        weight bytes each streams, then timed as drafting goes (``_timed_step``).  Times
        the draft's prompt tokens (``row_s``) on a 64-token prompt, read twice (the first
        read runs cold)."""
        for _ in range(2):
            self.prefill([("price", list(range(1, _PRICED_ROWS + 1)))])
            self.finish("price", [])
        w = self.model.weights
        streamed = w.nbytes - w.output.nbytes * (1 - self.head_rows / self.model.config.vocab_size)  # the head it runs
        self._decode_s, self._slope_s = decode_s, slope_s
        self._set_step(decode_s * streamed / max(target_bytes, 1))

    def _set_step(self, step_s: float) -> None:
        self.step_s = step_s  # one draft step of one sequence (Speculator.can_pay)
        self.min_conf = float(min(0.9, max(_MIN_CONF, (step_s + self._slope_s) / max(self._decode_s, 1e-9))))

    def _timed_step(self, seconds: float) -> None:
        """A draft step of one sequence and one token took ``seconds``, its logits' top
        token included: step_s follows it (STEP_EMA) once priced."""
        if self._decode_s > 0:
            self._set_step((1 - STEP_EMA) * self.step_s + STEP_EMA * seconds)

    def _step(self, chunks: list, want: list[int]) -> list[np.ndarray]:
        """Logits  # [want[i], head_rows] at the last ``want[i]`` tokens of each chunk i; a
        chunk of more than ``_EXECUTOR_ROWS`` tokens (the prompt, at a request's first
        proposal) runs all of them as a batched forward, as prefill does."""
        ends = np.cumsum([len(t) for _, t in chunks])
        rows = np.concatenate([np.arange(e - w, e) for e, w in zip(ends, want)])  # [sum(want)]
        if self.executor is None or max(len(t) for _, t in chunks) > _EXECUTOR_ROWS:
            t0 = time.perf_counter()
            logits = self._forward(chunks, rows)[:, :self.head_rows]
            self.read_s += time.perf_counter() - t0
        else:
            logits = self.executor.step_rows([s for s, _ in chunks], [t for _, t in chunks])[rows]
        return np.split(logits, np.cumsum(want)[:-1])

    def _forward(self, chunks: list, logit_rows: np.ndarray | None = None) -> np.ndarray:
        """``forward_chunks``; one of at least ``_PRICED_ROWS`` tokens sets ``row_s``."""
        t0 = time.perf_counter()
        logits = self.model.forward_chunks(chunks, logit_rows)
        rows = sum(len(t) for _, t in chunks)
        if rows >= _PRICED_ROWS:
            self.row_s = (time.perf_counter() - t0) / rows
        return logits

    def _guess(self, key, tokens: list[int], room: int) -> list[int]:
        """At most ``room`` tokens that may follow ``tokens``, looked up in the request's own
        prompt and output (module doc), cut before the first the draft's head cannot
        propose."""
        if room <= 0:
            return []
        guess = self.lookup.propose(key, tokens, room, chain=True).tokens.tolist()
        cut = next((i for i, t in enumerate(guess) if t >= self.head_rows), len(guess))
        return guess[:cut]

    def guesses(self, key, tokens: list[int]) -> bool:
        """Whether the request's text repeats: its last ``REPEAT_MATCH`` tokens occur earlier
        in its prompt or output, with a continuation after them (shorter ones, common
        phrases, turn up in any text).  There the next proposal copies (module doc)."""
        return self.lookup.repeats(key, tokens, REPEAT_MATCH)

    def observe(self, key, n_accepted: int, n_deepest: int) -> None:
        """The target accepted ``n_accepted`` tokens of the last proposal for ``key``: the
        lookup's acceptance rates (its copies' confidences) learn from it."""
        self.lookup.observe(key, n_accepted, n_deepest)

    def catch_up_s(self, key, tokens: list[int]) -> float:
        """Seconds, at least, that the next proposal for ``key`` spends reading the
        request's ``tokens`` its draft sequence lacks (at ``row_s``; its rejected drafts
        not counted)."""
        seq = self._seqs.get(key)
        return max(0, len(tokens) - (seq.n_tokens if seq is not None else 0)) * self.row_s

    def _seq(self, key):
        if key not in self._seqs:
            self._seqs[key] = PagedSequence(self.pool, self.n_ctx, None, f"draft {key}")
        return self._seqs[key]

    def propose_many(self, requests: list[tuple[object, list[int], int]], chain: bool = False) -> list[DraftTree]:
        """A tree for each (key, tokens, max_nodes), drafted together (module doc); with
        ``chain``, a copy is the lookup's most frequent path only (the draft model's own
        trees are a chain with the root's runners-up, whose best chain is the chain)."""
        out = [DraftTree.empty() for _ in requests]
        self.read_s = 0.0
        live, chunks, want = [], [], []  # live: [request, seq, draft tokens, confidences, max nodes, root siblings, guess]
        for r, (key, tokens, max_nodes) in enumerate(requests):
            if max_nodes <= 0 or len(tokens) + 1 >= self.n_ctx:
                continue
            copy = self.lookup.propose(key, tokens, max_nodes, chain)
            if len(copy) and self.lookup.match_length(key) >= REPEAT_MATCH:  # copying (module doc, guesses)
                out[r] = _within_head(copy, self.head_rows)
                self.copied.add(key)
                continue
            self.copied.discard(key)
            seq = self._seq(key)
            common, stop = 0, min(seq.n_tokens, len(tokens) - 1)
            while common < stop and seq.tokens[common] == tokens[common]:
                common += 1
            seq.truncate(common)
            catch_up = tokens[common:]
            room = min(max_nodes - 1, _EXECUTOR_ROWS - len(catch_up), self.n_ctx - len(tokens) - 2)
            guess = self._guess(key, tokens, room)
            chunks.append((seq, catch_up + guess))
            want.append(1 + len(guess))
            live.append((r, seq, [], [], max_nodes, [], guess))
        while chunks:
            t0 = time.perf_counter()
            one_token = len(chunks) == 1 and len(chunks[0][1]) == 1  # a step step_s prices
            logits = self._step(chunks, want)  # [want[i], vocab] per live request
            chunks, want, still = [], [], []
            for (r, seq, toks, conf, cap, siblings, guess), rows in zip(live, logits):
                read = seq.n_tokens - len(guess)  # tokens the draft holds for real; the guess after them
                for j, row in enumerate(rows):
                    first = not toks
                    ids, p = _top(row, 1 + _SIBLINGS if first else 1)
                    if first:
                        siblings.extend((int(t), float(pt)) for t, pt in zip(ids[1:], p[1:]))
                    toks.append(int(ids[0]))
                    conf.append((conf[-1] if conf else 1.0) * float(p[0]))
                    if not (j < len(guess) and guess[j] == toks[-1] and len(toks) < cap and conf[-1] >= self.min_conf):
                        break  # row j + 1 followed a token the draft does not propose
                seq.truncate(read + j)  # the guessed tokens the chain took stay read
                if len(toks) < min(self.depth, cap) and conf[-1] >= self.min_conf and seq.n_tokens + 2 < self.n_ctx:
                    chunks.append((seq, [toks[-1]]))
                    want.append(1)
                    still.append((r, seq, toks, conf, cap, siblings, []))
                else:
                    out[r] = self._tree(toks, conf, siblings, cap)
            if one_token:
                self._timed_step(time.perf_counter() - t0)
            live = still
        return out

    @staticmethod
    def _tree(toks, conf, siblings, cap) -> DraftTree:
        tokens = list(toks)
        parents = list(range(-1, len(toks) - 1))
        confs = list(conf)
        for t, pc in siblings:
            if len(tokens) >= cap:
                break
            tokens.append(t)
            parents.append(-1)
            confs.append(pc)
        # parents before children holds: the chain first, root siblings (parent -1) after
        return DraftTree(np.asarray(tokens, np.int64), np.asarray(parents, np.int64), np.asarray(confs, np.float64))

    def prefill(self, requests: list[tuple[object, list[int]]]) -> None:
        """Extend each (key, prompt tokens so far)'s draft sequence to those tokens, in one
        batched forward (the target's prompt chunks of this step)."""
        chunks = []
        for key, tokens in requests:
            seq = self._seq(key)
            if seq.tokens == tokens[:seq.n_tokens] and len(tokens) > seq.n_tokens and len(tokens) + 1 < self.n_ctx:
                chunks.append((seq, list(tokens[seq.n_tokens:])))
        if chunks:
            self._forward(chunks)

    def propose(self, key, tokens: list[int], max_nodes: int, chain: bool = False) -> DraftTree:
        return self.propose_many([(key, tokens, max_nodes)], chain)[0]

    def finish(self, key, tokens: list[int]) -> None:
        self.lookup.finish(key, tokens)
        self.copied.discard(key)
        seq = self._seqs.pop(key, None)
        if seq is not None:
            seq.free()
