"""A part of a claim's verdict, as a frozen record: its question, verdict, the numbers that
decided it and how they read in words.

A part carries its facts, not its sentence: `facts` is a record of the words modules
(analysis/words_*.py: the renderer's room, where every sentence of a reading is written), and
`sentence` renders it when a reader asks (as statsmodels' results render their summary). A part
whose reading module has not moved its sentences yet carries the sentence itself (a str).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from grpo_cli.analysis import bootstrap as bs


class Words(Protocol):
    """A reading's facts that can say themselves in one sentence (analysis/words_*.py)."""

    def sentence(self) -> str: ...


@dataclass(frozen=True)
class Part:
    """One part of a verdict: its question, verdict and the facts that explain it."""

    name: str  # "2a" | "2b" | "2c" (or "3", "4" in claims.py)
    question: str
    verdict: str
    facts: Words | str  # the numbers behind the verdict (a str: a sentence written elsewhere)
    flip: float = math.nan  # share of resamples whose reading differs from the estimate's
    seeds: int | None = None  # roughly how many seeds in all would settle an inconclusive part
    # the tests behind its contradicted reading (None: it has none, e.g. 2a); a claim reads its
    # parts together by Holm over their p-values (rank_verdict.read_together, rules.family_wise)
    contradiction: bs.Contradiction | None = None
    counted_as: str = ""  # its verdict as its claim counts it, read with the other parts (read_together)

    @property
    def sentence(self) -> str:
        """The sentence that explains the part, rendered from its facts."""
        return self.facts if isinstance(self.facts, str) else self.facts.sentence()

    @property
    def p_contradict(self) -> float:
        """The one-sided p-value of its contradicted reading (within-part Bonferroni included):
        it reads contradicted at its own level iff p < Rules.one_sided_level. NaN: none."""
        return self.contradiction.p() if self.contradiction is not None else math.nan


def say(piece: Part | Words | str) -> str:
    """A piece of evidence in words: a part's sentence, a record's, or a sentence as is."""
    if isinstance(piece, str):
        return piece
    return piece.sentence if isinstance(piece, Part) else piece.sentence()


@dataclass(frozen=True)
class Joined:
    """Pieces of evidence said one after another (a claim's evidence: its parts and readings)."""

    pieces: tuple  # of Part | Words | str
    sep: str = " "

    def sentence(self) -> str:
        return self.sep.join(say(piece) for piece in self.pieces)
