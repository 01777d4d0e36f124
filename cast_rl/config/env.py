"""Environment configuration: the tool-calling domain, its data and task split (or the procedural
retail generator's settings), and the simulated customer the agent talks to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cast_rl.config._checks import _check_choice, _check_positive
from cast_rl.config.inference import InferenceConfig
from cast_rl.config.model import ModelConfig, _check_no_aliases

DOMAIN_NAMES = ("retail", "airline", "telecom", "telehealth")
"""Every domain the project runs: the one list config validation, the CLI and the environment
registry (:mod:`cast_rl.envs.domain`) read."""

RETAIL_TASK_KINDS = (
    "cancel", "modify_items", "modify_address", "modify_payment", "return", "exchange",
    "user_address", "multi",
)
"""Task kinds of the procedural retail generator (:mod:`cast_rl.envs.retail_tasks`)."""

RETAIL_AUTH_CHOICES = ("either", "email", "name_zip")
"""How the procedural retail generator's users identify themselves (``env.generated_auth``)."""


@dataclass(frozen=True)
class EnvConfig:
    """The tool-calling environment: a domain, its data and the task split."""

    domain: str = "retail"
    """retail, airline, telecom or telehealth."""
    data_dir: str = ""
    """Domain data directory (db/*.json, policy.md, tools.json, tasks_<split>.json); empty means
    the embedded generated retail data under run_dir."""
    split: str = "test"
    """Task split: tasks_<split>.json in data_dir."""
    task_indices: list[int] = field(default_factory=list)
    """Tasks to run; empty means every task of the split."""
    max_steps: int = 30
    """Agent actions per episode before it ends with reward 0 (the source uses 30)."""
    now: str = ""
    """ISO time the tools read as "now" (telehealth cancel_appointment); empty is the wall clock."""
    tool_timeout_s: float = 10.0
    """A tool call taking longer becomes an error observation."""
    generated_tasks: int = 64
    """With data_dir empty: how many retail tasks the generator writes."""
    generated_seed: int = 0
    """With data_dir empty: the generator's seed."""
    generated_kinds: list[str] = field(default_factory=lambda: list(RETAIL_TASK_KINDS))
    """With data_dir empty: the task kinds generated (a subset of cancel, modify_items,
    modify_address, modify_payment, return, exchange, user_address, multi)."""
    generated_compact: bool = False
    """With data_dir empty: the compact setting (a policy cut to the rules of generated_kinds and
    only the tools their tasks use); same database, tools and reward, far shorter prompts."""
    generated_auth: str = "either"
    """With data_dir empty: how generated users identify themselves: either (email or name and
    zip code, half each), email or name_zip."""

    def __post_init__(self) -> None:
        _check_choice("env.domain", self.domain, DOMAIN_NAMES)
        _check_positive("env.max_steps", self.max_steps)
        _check_positive("env.tool_timeout_s", self.tool_timeout_s)
        _check_positive("env.generated_tasks", self.generated_tasks)
        _check_choice("env.generated_auth", self.generated_auth, RETAIL_AUTH_CHOICES)
        bad = [k for k in self.generated_kinds if k not in RETAIL_TASK_KINDS]
        if bad or not self.generated_kinds:
            raise ValueError(f"env.generated_kinds={self.generated_kinds} is not allowed; choose a "
                             f"non-empty subset of {list(RETAIL_TASK_KINDS)}")
        if self.now:
            from datetime import datetime

            try:
                datetime.fromisoformat(self.now)
            except ValueError:
                raise ValueError(
                    f"env.now={self.now!r} is not allowed; give an ISO time such as "
                    "2024-05-15T15:00:00"
                ) from None


USER_TRAITS = ("none", "impatience", "confusion", "skepticism", "incoherence")
"""tau-trait's four user traits (collinear-ai/tau-trait trait dictionaries), plus none."""


@dataclass(frozen=True)
class UserConfig:
    """The simulated customer."""

    type: str = "scripted"
    """scripted (deterministic, for tests and the embedded default) or llm."""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(path="runs/models/tiny-user"))
    """For type=llm: the user model."""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    """For type=llm: the engine serving the user model."""
    timeout_s: float = 60.0
    """A user turn taking longer ends the episode as a recorded failure."""
    trait: str = "none"
    """tau-trait's user trait: none, impatience, confusion, skepticism or incoherence (scripted:
    rule-based behaviour; llm: a persona line in the prompt; see cast_rl.envs.users.traits)."""
    trait_level: str = "medium"
    """Strength of the trait: low, medium or high (tau-trait's intensities)."""
    max_turns: int = 20
    """Scripted user: agent messages it answers before it ends the conversation."""

    def __post_init__(self) -> None:
        _check_choice("user.type", self.type, ("scripted", "llm"))
        _check_positive("user.timeout_s", self.timeout_s)
        _check_choice("user.trait", self.trait, USER_TRAITS)
        _check_choice("user.trait_level", self.trait_level, ("low", "medium", "high"))
        _check_positive("user.max_turns", self.max_turns)
        _check_no_aliases("user", self.model)
        if self.inference.backend == "expert":
            raise ValueError("user.inference.backend='expert' is not allowed; the expert is a "
                             "policy (inference.backend); serve the user with vllm or openai")
