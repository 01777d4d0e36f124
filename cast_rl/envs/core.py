"""Domain-generic environment core: domain data, a synchronous tool env, an async episode.

Reproduces the episode and reward rule of tau-bench's ``envs/base.py`` (see
``shared/benchmarks/README.md``) on the copy-on-write :class:`~cast_rl.envs.db.Database`:

* :class:`DomainData` is loaded once per (domain, data directory, clock): the pristine database,
  policy, tool schemas, tasks per split (lazily) and a cache of gold-replay databases, so the
  reward's gold replay runs once per task instead of once per episode.
* :class:`ToolEnv` is one episode's state over a fork of the pristine database.  ``step`` runs
  tool calls like the source (``"Error: <exc>"`` for exceptions, ``"Unknown action <name>"``,
  terminate tools end the episode, ``max_steps`` agent actions end it with reward 0) and records
  ``respond`` actions for the output check; their user reply comes from :class:`Episode`.
* :class:`Episode` adds a :class:`~cast_rl.envs.users.base.UserSimulator`.

Malformed calls are data: non-object arguments, unknown tools, bad arguments and oversized inputs
all become observation strings, never exceptions out of ``step``.  There is no preemptive tool
timeout (a thread cannot be interrupted and signals only work in the main thread); instead the
argument size bound (:data:`MAX_ARGUMENT_CHARS`, :data:`MAX_ARGUMENT_ITEMS`) keeps every tool's
work bounded, and a call slower than ``tool_timeout_s`` is logged.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cast_rl.envs.db import Database
from cast_rl.envs.domain import DomainSpec, get_domain, tool_name
from cast_rl.envs.types import RESPOND, STOP_TOKEN, Action, StepResult, Task
from cast_rl.envs.users.base import UserSimulator
from cast_rl.models.chat import call_arguments

logger = logging.getLogger(__name__)

MAX_ARGUMENT_CHARS = 100_000
"""Total characters of text (strings and keys) one tool call's arguments may hold."""
MAX_ARGUMENT_ITEMS = 1_000
"""Total list/dict entries one tool call's arguments may hold (tools count items quadratically)."""
_SOURCE_TOOL_PACKAGES = {
    "retail": "tau_bench.envs.retail.tools",
    "airline": "tau_bench.envs.airline.tools",
    "telecom": "tau_trait.envs.telecom.tools",
    "telehealth": "tau_trait.envs.telehealth.tools",
}
"""Where the source defines each domain's tools: Python names them in one error text."""


@functools.lru_cache(maxsize=64)
def fixed_clock(iso: str) -> Callable[[], datetime]:
    """A clock that always reads ``iso`` (the same callable for the same string)."""
    now = datetime.fromisoformat(iso)
    return lambda: now


@dataclass
class DomainData:
    """Everything read-only about a domain's data directory, shared by all its episodes."""

    domain: str
    spec: DomainSpec
    data_dir: Path
    db: Database
    """The pristine database; episodes work on forks and never write to it."""
    policy: str
    tools: list[dict[str, Any]]
    """Tool schemas (tools.json), in the source's order."""
    wall_clock: bool = False
    _tasks: dict[str, tuple[Task, ...]] = field(default_factory=dict, repr=False)
    _gold: dict[tuple[str, int], tuple[Any, Database]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _linked: dict[str, DomainData] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.tool_map: dict[str, type] = self.spec.tool_map

    @property
    def splits(self) -> list[str]:
        """Splits that have a tasks_<split>.json file, then the linked ones (:meth:`link_split`)."""
        own = sorted(p.stem.removeprefix("tasks_") for p in self.data_dir.glob("tasks_*.json"))
        return own + sorted(self._linked)

    def link_split(self, split: str, other: DomainData) -> None:
        """Serve ``other``'s split ``split`` as a split of this data: its tasks run on ``other``'s
        database (e.g. a database generated with a seed training never read, evaluated by the
        same workers).  The two must agree on domain, policy and tools, since an episode shows
        this data's policy and tool list."""
        for name, mine, theirs in (("domain", self.domain, other.domain), ("policy", self.policy, other.policy),
                                   ("tools", self.tools, other.tools)):
            if mine != theirs:
                raise ValueError(f"split {split!r} of {other.data_dir} cannot be linked to {self.data_dir}: "
                                 f"their {name} differ")
        if split not in other.splits or split in self.splits:
            raise ValueError(f"split {split!r}: {other.data_dir} must hold it and {self.data_dir} must not")
        self._linked[split] = other

    def for_split(self, split: str) -> DomainData:
        """The data whose database ``split``'s tasks run on: this one, or a linked one."""
        return self._linked.get(split, self)

    def tasks(self, split: str) -> tuple[Task, ...]:
        """The split's tasks, read on first use."""
        if split in self._linked:
            return self._linked[split].tasks(split)
        if split not in self._tasks:
            path = self.data_dir / f"tasks_{split}.json"
            if not path.is_file():
                raise ValueError(
                    f"split {split!r} not found: no {path}; available splits of {self.domain}: "
                    f"{', '.join(self.splits) or 'none'}"
                )
            tasks = tuple(Task.from_json(obj) for obj in json.loads(path.read_text()))
            with self._lock:
                self._tasks.setdefault(split, tasks)
        return self._tasks[split]

    def task(self, split: str, task_index: int) -> Task:
        tasks = self.tasks(split)
        if not 0 <= task_index < len(tasks):
            raise IndexError(
                f"task_index={task_index} is out of range for split {split!r} of {self.domain} "
                f"({len(tasks)} tasks: 0..{len(tasks) - 1})"
            )
        return tasks[task_index]

    def gold_db(self, split: str, task_index: int) -> Database:
        """The database after the task's gold actions, terminate tools skipped (cached)."""
        if split in self._linked:
            return self._linked[split].gold_db(split, task_index)
        # With the wall clock a tool may write today's date, so a cached replay expires daily.
        stamp = self.db.clock().date() if self.wall_clock else None
        cached = self._gold.get((split, task_index))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        db = self.db.fork()
        for action in self.task(split, task_index).actions:
            if action.name != RESPOND and action.name not in self.spec.terminate_tools:
                call_tool(self, db, action)
        with self._lock:
            self._gold[(split, task_index)] = (stamp, db)
        return db


_DATA_CACHE: dict[tuple[str, Path, Callable[[], datetime] | None], DomainData] = {}
_DATA_LOCK = threading.Lock()


def load_domain_data(
    domain: str, data_dir: str | Path, clock: Callable[[], datetime] | None = None
) -> DomainData:
    """The domain's data, loaded once per (domain, directory, clock); None is the wall clock."""
    path = Path(data_dir).resolve()
    key = (domain, path, clock)
    with _DATA_LOCK:
        if key in _DATA_CACHE:
            return _DATA_CACHE[key]
    spec = get_domain(domain)
    if not path.is_dir():
        raise FileNotFoundError(f"data directory of domain {domain!r} not found: {path}")
    for name in ("db", "policy.md", "tools.json"):
        if not (path / name).exists():
            raise FileNotFoundError(f"{path / name} not found (a {domain} data directory needs it)")
    data = DomainData(
        domain=domain,
        spec=spec,
        data_dir=path,
        db=Database.load(path / "db", clock=clock or datetime.now),
        policy=(path / "policy.md").read_text(),
        tools=json.loads((path / "tools.json").read_text()),
        wall_clock=clock is None,
    )
    logger.info("loaded %s data from %s (splits: %s)", domain, path, ", ".join(data.splits))
    with _DATA_LOCK:
        return _DATA_CACHE.setdefault(key, data)


def parse_tool_call(name: Any, arguments: str | Mapping[str, Any] | None) -> Action | str:
    """An :class:`Action` from a model's tool call, or the error observation to show it.

    ``arguments`` is the raw JSON string (an empty string means no arguments) or a parsed object.
    """
    if not isinstance(name, str):
        return f"Error: the tool name must be a string, got {type(name).__name__}"
    kwargs = call_arguments(arguments)
    return f"Error: {kwargs}" if isinstance(kwargs, str) else Action(name=name, kwargs=kwargs)


def _oversize(kwargs: Mapping[Any, Any]) -> str | None:
    """Why the arguments exceed the size bound, or None (an iterative walk, no recursion)."""
    chars, items, stack = 0, 0, [kwargs]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, Mapping):
            items += len(value)
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            items += len(value)
            stack.extend(value)
        if chars > MAX_ARGUMENT_CHARS:
            return f"more than {MAX_ARGUMENT_CHARS} characters of text"
        if items > MAX_ARGUMENT_ITEMS:
            return f"more than {MAX_ARGUMENT_ITEMS} list or object entries"
    return None


def call_tool(data: DomainData, db: Database, action: Action, timeout_s: float = 0.0) -> str:
    """Run one tool call on ``db``; every failure becomes the observation string."""
    name, kwargs = action.name, action.kwargs
    tool = data.tool_map.get(name) if isinstance(name, str) else None
    if tool is None:
        return f"Unknown action {name}"
    if not isinstance(kwargs, Mapping):
        return f"Error: the tool arguments must be a JSON object, got {type(kwargs).__name__}"
    problem = _oversize(kwargs)
    if problem is not None:
        return f"Error: the arguments of {name} are too large ({problem})"
    if "data" in kwargs and all(isinstance(key, str) for key in kwargs):
        # Python names the function with its module here; report the source's module.
        package = _SOURCE_TOOL_PACKAGES.get(data.domain)
        module = f"{package}.{tool_name(tool)}" if package else tool.__module__
        return (
            f"Error: {module}.{tool.__name__}.invoke() got multiple values for keyword "
            "argument 'data'"
        )
    start = time.perf_counter()
    try:
        observation = tool.invoke(data=db, **kwargs)
    except Exception as exc:  # the source shows every tool exception to the agent
        observation = f"Error: {exc}"
    if not isinstance(observation, str):  # airline send_certificate returns None in the source
        observation = str(observation)
    elapsed = time.perf_counter() - start
    if timeout_s and elapsed > timeout_s:
        logger.warning("tool %s took %.1f s (tool_timeout_s=%s)", name, elapsed, timeout_s)
    return observation


def _respond_content(action: Action) -> str | None:
    kwargs = action.kwargs
    content = kwargs.get("content") if isinstance(kwargs, Mapping) else None
    return content if isinstance(content, str) else None


class ToolEnv:
    """One episode's state over a task, without the user (see the module docstring)."""

    def __init__(
        self,
        data: DomainData,
        split: str,
        task_index: int,
        max_steps: int | None = 30,
        tool_timeout_s: float = 10.0,
    ) -> None:
        self.data = data.for_split(split)
        self.split = split
        self.task_index = task_index
        self.task: Task = self.data.task(split, task_index)
        self.max_steps = max_steps
        """Agent actions before the episode ends with reward 0; None means no limit."""
        self.tool_timeout_s = tool_timeout_s
        self.db: Database = self.data.db.fork()
        self.actions: list[Action] = []
        self.done = False
        self.last_reward = 0.0
        self.last_info: dict[str, Any] = {}

    def fork(self) -> ToolEnv:
        """An independent copy: later steps on either side are invisible to the other."""
        child = ToolEnv.__new__(ToolEnv)
        child.__dict__.update(self.__dict__)
        child.db = self.db.fork()
        child.actions = list(self.actions)
        child.last_info = dict(self.last_info)
        return child

    @property
    def num_steps(self) -> int:
        return len(self.actions)

    def state_hash(self) -> str:
        """sha256 of the database as sorted-key JSON (the replay CLI's final_state_hash)."""
        return self.db.state_hash()

    def step(self, action: Action) -> StepResult:
        """Apply one agent action; a ``respond`` gets an empty observation here."""
        observation, terminal = self.apply(action)
        return self.settle(observation, terminal, source=action.name)

    def apply(self, action: Action) -> tuple[str, bool]:
        """Record and run one action without settling the episode: (observation, terminal)."""
        if self.done:
            raise RuntimeError("step() on a finished episode; start a new ToolEnv")
        self.actions.append(action)
        if action.name == RESPOND:
            if _respond_content(action) is None:
                return 'Error: respond needs {"content": <message text>}', False
            return "", False
        observation = call_tool(self.data, self.db, action, self.tool_timeout_s)
        terminal = (
            action.name in self.data.spec.terminate_tools and action.name in self.data.tool_map
        )
        return observation, terminal

    def settle(self, observation: str, terminal: bool, source: Any = None) -> StepResult:
        """The step result after :meth:`apply`: rewards a terminal step, enforces ``max_steps``."""
        info: dict[str, Any] = {"source": source}
        if terminal:
            reward, reward_info = self.reward()
            info.update(reward_info)
        elif self.max_steps is not None and self.num_steps >= self.max_steps:
            terminal, reward = True, 0.0  # the source's agent loop stops without a reward
            info["max_steps_reached"] = True
        else:
            return StepResult(observation=observation, info=info)
        self.done, self.last_reward, self.last_info = True, reward, info
        return StepResult(observation=observation, reward=reward, done=True, info=info)

    def reward(self, check_outputs: bool = True) -> tuple[float, dict[str, Any]]:
        """The source's reward as if the episode ended now, and its details.

        ``r_actions``: the database equals the gold replay's (source hash semantics).
        ``r_outputs``/``outputs`` (tasks with outputs, when ``check_outputs``): each required
        output appears, lowercase, in some ``respond`` text with its commas removed.
        """
        r_actions = self.db.same_state(self.data.gold_db(self.split, self.task_index))
        reward = 1.0 if r_actions else 0.0
        info: dict[str, Any] = {"r_actions": reward}
        if check_outputs and self.task.outputs:
            # The source's gold replay appends the gold actions to the episode's own, so gold
            # respond messages count as replies too (no current task has any).
            texts = [
                text.lower().replace(",", "")
                for action in (*self.actions, *self.task.actions)
                if action.name == RESPOND and (text := _respond_content(action)) is not None
            ]
            outputs = {out: any(out.lower() in text for text in texts) for out in self.task.outputs}
            info["r_outputs"] = 1.0 if all(outputs.values()) else 0.0
            info["outputs"] = outputs
            reward = min(reward, info["r_outputs"])
        return reward, info


class StepTimeout(Exception):
    """A tool or the user did not answer within its timeout; ``reason`` says which
    (``tool_timeout`` or ``user_timeout``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def _within(work: Any, timeout_s: float | None, reason: str) -> Any:
    try:
        return await asyncio.wait_for(work, timeout_s)
    except asyncio.TimeoutError:
        raise StepTimeout(reason) from None


class Episode:
    """A :class:`ToolEnv` plus a simulated user: the async interface rollouts drive."""

    def __init__(
        self,
        data: DomainData,
        split: str,
        task_index: int,
        user: UserSimulator,
        max_steps: int | None = 30,
        tool_timeout_s: float = 10.0,
    ) -> None:
        self.data, self.split, self.task_index = data, split, task_index
        self.user = user
        self.max_steps, self.tool_timeout_s = max_steps, tool_timeout_s
        self.env = ToolEnv(data, split, task_index, max_steps, tool_timeout_s)

    @property
    def task(self) -> Task:
        return self.env.task

    async def reset(self) -> str:
        """Start over on a fresh fork; returns the user's first message."""
        self.env = ToolEnv(
            self.data, self.split, self.task_index, self.max_steps, self.tool_timeout_s
        )
        return await self.user.reset(self.env.task, self.env.db)

    def fork(self) -> Episode:
        """An independent copy of the episode: the environment forked copy-on-write, the user's
        state copied and pointed at the fork's database."""
        child = copy.copy(self)
        child.env = self.env.fork()
        child.user = self.user.fork()
        observe = getattr(child.user, "observe_db", None)
        if observe is not None:
            observe(child.env.db)
        return child

    async def step(
        self, action: Action, tool_timeout_s: float | None = None, user_timeout_s: float | None = None,
    ) -> StepResult:
        """A tool call runs in the env; a ``respond`` is answered by the user.

        With ``tool_timeout_s`` the tool runs in a worker thread and the episode stops waiting
        after that long (a hung tool, e.g. on pathological arguments, cannot be interrupted; it
        works on this episode's private fork only); ``user_timeout_s`` bounds the user's reply.
        Either raises :class:`StepTimeout`.
        """
        if action.name != RESPOND:
            if tool_timeout_s is None:
                return self.env.step(action)
            return await _within(asyncio.to_thread(self.env.step, action), tool_timeout_s, "tool_timeout")
        observation, _ = self.env.apply(action)
        content = _respond_content(action)
        if content is None:
            return self.env.settle(observation, False, source=RESPOND)
        reply = await _within(self.user.step(content), user_timeout_s, "user_timeout")
        return self.env.settle(reply, STOP_TOKEN in reply, source="user")
