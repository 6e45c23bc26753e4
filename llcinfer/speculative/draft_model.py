"""A smaller model of the same vocabulary drafts for the target.

Each request gets a sequence in the draft model's own KV pool, kept in step with the
request's tokens (what the target rejected is truncated away at the next proposal).  One
proposal runs ``depth`` batched draft forwards for every drafting request at once: the
first catches the sequence up (the tokens the target accepted since), each next one
feeds the previous draft token.  Drafts are greedy (the draft's top-1), so the tree is
deterministic and the acceptance walk stays lossless; the root also gets the draft's
next-best tokens as siblings.  A node's confidence is the draft's probability of its
path (product of the draft's softmax probabilities along it).
"""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from ..kv import PagedSequence
from .tree import DraftTree

_SIBLINGS = 2  # extra root children: the draft's 2nd and 3rd choices
_MIN_CONF = 0.02  # a chain stops growing below this path confidence


def check_draft_compatible(draft_cfg, target_cfg, draft_vocab: list[str], target_vocab: list[str],
                           draft_bytes: int, target_bytes: int, draft_name: str) -> None:
    """One-line UsageError when ``draft_name`` cannot draft for the target."""
    if draft_cfg.vocab_size != target_cfg.vocab_size or draft_vocab != target_vocab:
        raise UsageError(f"draft model {draft_name} does not share the target's vocabulary "
                         f"({draft_cfg.vocab_size} vs {target_cfg.vocab_size} tokens)")
    if draft_bytes >= target_bytes:
        raise UsageError(f"draft model {draft_name} ({draft_bytes / 2**20:.0f} MiB) is not smaller than the target "
                         f"({target_bytes / 2**20:.0f} MiB)")


def _softmax(row: np.ndarray) -> np.ndarray:
    e = np.exp(row - row.max())
    return e / e.sum()


class DraftModelDrafter:
    name = "draft"

    def __init__(self, model, n_ctx: int, n_seq: int, depth: int = 6):
        self.model = model  # a Transformer: forward_chunks, new_pool
        self.depth = depth
        self.n_ctx = n_ctx
        self.pool, self.prefix = model.new_pool(n_ctx, n_seq, None, prefix_sharing=False)
        self._seqs: dict[object, object] = {}  # request key -> its PagedSequence in the draft pool

    def _seq(self, key):
        if key not in self._seqs:
            self._seqs[key] = PagedSequence(self.pool, self.n_ctx, None, f"draft {key}")
        return self._seqs[key]

    def propose_many(self, requests: list[tuple[object, list[int], int]]) -> list[DraftTree]:
        """A tree for each (key, tokens, max_nodes), drafted together (module doc)."""
        out = [DraftTree.empty() for _ in requests]
        live, chunks = [], []  # live: [request index, seq, draft tokens, confidences, max nodes, root siblings]
        for r, (key, tokens, max_nodes) in enumerate(requests):
            if max_nodes <= 0 or len(tokens) + 1 >= self.n_ctx:
                continue
            seq = self._seq(key)
            common, stop = 0, min(seq.n_tokens, len(tokens) - 1)
            while common < stop and seq.tokens[common] == tokens[common]:
                common += 1
            seq.truncate(common)
            chunks.append((seq, tokens[common:]))
            live.append((r, seq, [], [], max_nodes, []))
        while chunks:
            logits = self.model.forward_chunks(chunks)  # [n live, vocab] at each chunk's last token
            chunks, still = [], []
            for (r, seq, toks, conf, cap, siblings), row in zip(live, logits):
                p = _softmax(row.astype(np.float64))  # [vocab]
                first = not toks
                order = np.argsort(-p)[:1 + _SIBLINGS] if first else [int(np.argmax(p))]
                path_conf = conf[-1] if conf else 1.0
                if first:
                    siblings.extend((int(t), float(p[t])) for t in order[1:])
                toks.append(int(order[0]))
                conf.append(path_conf * float(p[order[0]]))
                if len(toks) < min(self.depth, cap) and conf[-1] >= _MIN_CONF and seq.n_tokens + 2 < self.n_ctx:
                    chunks.append((seq, [toks[-1]]))
                    still.append((r, seq, toks, conf, cap, siblings))
                else:
                    out[r] = self._tree(toks, conf, siblings, cap)
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

    def propose(self, key, tokens: list[int], max_nodes: int) -> DraftTree:
        return self.propose_many([(key, tokens, max_nodes)])[0]

    def finish(self, key, tokens: list[int]) -> None:
        seq = self._seqs.pop(key, None)
        if seq is not None:
            seq.free()
