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
        self._after: dict[int, list[int]] | None = None  # token -> ends e (edited[e - 1] is it, e < n_prompt)
        self._edited_list: list[int] = []  # edited, as a list (read token by token)

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
        self._after = None

    def ends(self, pattern: tuple[int, ...]) -> list[int]:
        """The positions e after each occurrence of ``pattern`` in the edited prompt
        (edited[e - n:e] == pattern) that have a prompt token after them, increasing."""
        return self.ends_upto(list(pattern))[-1] if pattern else []

    def ends_upto(self, suffix: list[int]) -> list[list[int]]:
        """``[self.ends(tuple(suffix[-n:])) for n in 1..len(suffix)]``: the ends of the
        last token, looked up in a map from each token to the ends after it (made once
        per set of substitutions), narrowed one token further back at a time."""
        if self._after is None:
            self._edited_list = self.edited.tolist()
            self._after = {}
            for e, t in enumerate(self._edited_list[:-1], 1):
                self._after.setdefault(t, []).append(e)
        if not suffix:
            return []
        m, e = self._edited_list, self._after.get(suffix[-1], [])
        out = [e]
        for n in range(2, len(suffix) + 1):
            want = suffix[-n]
            e = [x for x in e if x >= n and m[x - n] == want]
            out.append(e)
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
