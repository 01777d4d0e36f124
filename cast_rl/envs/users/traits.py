"""tau-trait's user traits as scripted behaviour, and as persona lines for the LLM user.

tau-trait (collinear-ai/tau-trait) steers its user model with a trait dictionary of four traits,
each at an intensity (``{"impatience": "medium", "confusion": "low", "skeptical": "low",
"incoherence": "low"}``).  Here one trait is chosen (``user.trait``) at one level
(``user.trait_level``); the scripted user turns it into rules that act on its replies, drawing
from the episode's seeded random generator, so a run is reproducible:

==============  ==========================================================================
impatience      hurries the agent ("Can we speed this up?") and abandons the conversation
                (``###STOP###``) after :data:`PATIENCE` agent messages, done or not.
confusion       asked to confirm, sometimes answers with a confused question instead of a
                yes ("Sorry, I'm confused. What exactly are you going to do?"); otherwise
                sometimes opens with a confused aside.
skepticism      asked to confirm, sometimes doubts the proposal instead of agreeing ("Are you
                sure that is right? Please double-check it before I agree.").
incoherence     adds unrelated remarks to its replies, and asked to confirm sometimes
                contradicts itself ("Yes... no, wait. What was the question again?").
==============  ==========================================================================

Each level sets the probabilities in :data:`RATES` (a reply to a confirmation that is not a yes
costs a policy one more question; an agent that asks three times and then gives up, like the
expert, loses the write with probability rate cubed).  For ``user.type=llm`` the same trait is a
line of the system prompt (:func:`persona_line`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from cast_rl.config.schema import USER_TRAITS

LEVELS = ("low", "medium", "high")
PATIENCE = {"low": 14, "medium": 9, "high": 6}
"""Impatience: agent messages the user answers before it leaves."""
RATES = {
    "impatience": {"low": 0.3, "medium": 0.6, "high": 1.0},
    "confusion": {"low": 0.2, "medium": 0.4, "high": 0.7},
    "skepticism": {"low": 0.3, "medium": 0.5, "high": 0.75},
    "incoherence": {"low": 0.1, "medium": 0.25, "high": 0.5},
}
"""Per trait and level: the chance that a reply to a confirmation is not a yes (impatience:
that a reply carries a hurry line)."""
_HURRY = ("Can we speed this up? ", "Please be quick. ", "I don't have all day. ")
_TANGENTS = (
    " By the way, my neighbour's dog has been barking all week.",
    " Anyway, I was thinking about what to cook tonight.",
    " Oh, and it rained a lot here yesterday.",
)
_PERSONAS = {
    "impatience": "You are impatient: you want this over quickly, you complain when it drags on, "
                  "and you may give up on a long conversation.",
    "confusion": "You are easily confused: you often misunderstand the agent and ask what they "
                 "mean before you answer.",
    "skepticism": "You are skeptical: you doubt what the agent proposes and ask them to "
                  "double-check before you agree.",
    "incoherence": "You are incoherent: you drift into unrelated remarks and sometimes "
                   "contradict yourself.",
}


@dataclass(frozen=True)
class Trait:
    """One tau-trait trait at one level (``none`` changes nothing)."""

    name: str = "none"
    level: str = "medium"

    def __post_init__(self) -> None:
        if self.name not in USER_TRAITS:
            raise ValueError(f"user.trait={self.name!r} is not allowed; choose one of {', '.join(USER_TRAITS)}")
        if self.level not in LEVELS:
            raise ValueError(f"user.trait_level={self.level!r} is not allowed; choose one of {', '.join(LEVELS)}")

    def gives_up(self, turns: int) -> bool:
        """Impatience: whether the user leaves at its ``turns``-th reply."""
        return self.name == "impatience" and turns > PATIENCE[self.level]

    def shape(self, kind: str, reply: str, rng: random.Random) -> tuple[str, str]:
        """The reply as this trait says it, and a note naming the change ('' if none).

        ``kind`` is the rule that produced ``reply``: open, identity, confirm, refuse, detail,
        restate or next.
        """
        if self.name == "none":
            return reply, ""
        rate = RATES[self.name][self.level]
        hit = rng.random() < rate
        if self.name == "impatience":
            return (rng.choice(_HURRY) + reply, "trait:impatience hurry") if hit else (reply, "")
        if kind == "confirm":
            if not hit:
                return reply, ""
            if self.name == "confusion":
                return "Sorry, I'm confused. What exactly are you going to do? Can you explain it again?", "trait:confusion unsure"
            if self.name == "skepticism":
                return "Are you sure that is right? Please double-check it before I agree.", "trait:skepticism doubt"
            return "Yes... no, wait. Hmm, what was the question again?" + rng.choice(_TANGENTS), "trait:incoherence contradicts"
        if self.name == "confusion" and hit:
            return "Um, sorry, I'm a bit lost. " + reply, "trait:confusion aside"
        if self.name == "skepticism" and hit and kind in ("refuse", "next"):
            return "Hmm, I'm not sure I trust this. " + reply, "trait:skepticism aside"
        if self.name == "incoherence" and rng.random() < min(1.0, 2 * rate):
            return reply + rng.choice(_TANGENTS), "trait:incoherence tangent"
        return reply, ""


def persona_line(trait: Trait) -> str:
    """The LLM user's system-prompt line for ``trait`` ('' for none)."""
    if trait.name == "none":
        return ""
    return f"{_PERSONAS[trait.name]} The strength of this trait is {trait.level}."
