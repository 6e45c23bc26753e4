"""Copying with edits: the token substitutions a target makes while it copies its prompt.

A code-edit answer ("rename this variable", "return the whole function") repeats the
prompt with a few tokens changed wherever they occur: `chunks` becomes `pieces`, the
8-space indent of a method becomes the 4-space indent of a function.  Plain prompt lookup
fails at every changed token, and after each failure its n-gram match starts over from
one or two tokens.  ``CopyEdits`` learns each change the first time the target makes it
(a drafted prompt token the target replaced by another, once the draft was aligned with
the prompt) and finds the sequence's suffix in the prompt with every learned change
applied, so the next drafts copy the edited text.

A substitution that proves wrong is learned again from the token the target wrote
instead, or dropped when the target kept the prompt's token.  Drafts are only proposals:
verification keeps the output the target's own.
"""

from __future__ import annotations

import numpy as np

MAX_SUBSTITUTIONS = 64  # per request: a rename or a re-indent needs a few


class CopyEdits:
    """One request's prompt and the substitutions learned while the target copies it."""

    def __init__(self, prompt: list[int]):
        self.prompt = np.asarray(prompt, np.int64)  # [n_prompt] the tokens the request started from
        self.edited = self.prompt.copy()  # [n_prompt] the same with every learned substitution applied
        self.subs: dict[int, int] = {}  # prompt token -> the token the target writes in its place

    def __len__(self) -> int:
        return int(self.prompt.size)

    def learn(self, src: int, out: int) -> None:
        """The target wrote ``out`` where the prompt it was copying has ``src``."""
        if out == src:
            if self.subs.pop(src, None) is None:
                return
        elif src in self.subs or len(self.subs) < MAX_SUBSTITUTIONS:
            self.subs[src] = out
        else:
            return
        self.edited[self.prompt == src] = out

    def ends(self, pattern: tuple[int, ...]) -> np.ndarray:
        """The positions e after each occurrence of ``pattern`` in the edited prompt
        (edited[e - n:e] == pattern) that have a prompt token after them, increasing."""
        n, m = len(pattern), self.edited
        if n == 0 or n >= m.size:
            return np.zeros(0, np.int64)
        e = np.flatnonzero(m[n - 1:m.size - 1] == pattern[-1]) + n  # [hits] candidate ends, e <= n_prompt - 1
        for k in range(2, n + 1):
            e = e[m[e - k] == pattern[-k]]
        return e

    def ends_upto(self, suffix: list[int]) -> list[np.ndarray]:
        """``[self.ends(tuple(suffix[-n:])) for n in 1..len(suffix)]``, narrowing one set of
        candidate ends instead of scanning the prompt once per length."""
        m, out = self.edited, []
        if not suffix or m.size < 2:
            return [np.zeros(0, np.int64) for _ in suffix]
        e = np.flatnonzero(m[:m.size - 1] == suffix[-1]) + 1  # [hits] ends of the last token, e <= n_prompt - 1
        out.append(e)
        for n in range(2, len(suffix) + 1):
            e = e[e >= n]
            e = e[m[e - n] == suffix[-n]]
            out.append(e if n < m.size else np.zeros(0, np.int64))
        return out

    def continuation(self, end: int, depth: int, tokens: list[int]) -> list[int]:
        """The ``depth`` tokens after ``end`` in the edited prompt, running on into the
        request's own tokens past the prompt."""
        cont = self.edited[end:end + depth].tolist()
        if end + depth > self.prompt.size:
            cont += tokens[self.prompt.size:end + depth]
        return cont

    def origin(self, end: int, depth: int) -> list[int]:
        """The prompt tokens under ``continuation(end, depth, ...)``, as far as the prompt goes."""
        return self.prompt[end:end + depth].tolist()
