"""``cast-rl env ...``: generate synthetic tasks and replay action sequences through a domain.

    cast-rl env generate [CONFIG] env.generated_seed=0 env.generated_tasks=64 --out runs/data/retail
    cast-rl env replay [CONFIG] env.domain=retail env.data_dir=../shared/benchmarks/retail \\
        env.split=test [env.now=2024-05-15T15:00:00] [--actions-file A.jsonl] --out replay.jsonl

``generate`` writes the procedural retail data the config describes (``env.generated_*``; see
:mod:`cast_rl.envs.generate`).  ``replay`` replays the gold actions of every task of ``env.split``
(or the sequences of ``--actions-file``) through the config's domain data and writes one record
per task (see :mod:`cast_rl.envs.replay`).
"""

from __future__ import annotations

import argparse
import sys

from cast_rl.config.args import add_config_arguments, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("env", help="environments: generate tasks, replay actions")
    sub = parser.add_subparsers(dest="env_command", required=True)

    gen = sub.add_parser("generate", help="write a procedural retail database and tasks (env.generated_*)")
    add_config_arguments(gen, example="env.generated_tasks=64")
    gen.add_argument("--out", required=True, help="output data directory")
    gen.set_defaults(func=_generate)

    rep = sub.add_parser("replay", help="replay gold or given actions; write observations, hash, reward")
    add_config_arguments(rep, example="env.data_dir=../shared/benchmarks/airline")
    rep.add_argument("--actions-file", default=None, help='JSON Lines: {"split", "task_index", "actions"}')
    rep.add_argument("--out", required=True, help="output JSON Lines, one record per task")
    rep.set_defaults(func=_replay)


def _generate(args: argparse.Namespace) -> int:
    from cast_rl.config import ConfigError
    from cast_rl.envs.generate import write_retail

    env = config_from_args(args).env
    if env.domain != "retail":
        raise ConfigError(f"config error: env.domain={env.domain!r} is not allowed here; only retail is generated")
    counts = write_retail(args.out, env.generated_seed, env.generated_tasks, tuple(env.generated_kinds),
                          env.generated_compact, env.generated_auth)
    print(f"wrote {args.out}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 0


def _replay(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from cast_rl.envs.replay import read_actions_file, replay
    from cast_rl.envs.setup import load_env_data

    cfg = config_from_args(args)
    split = cfg.env.split
    try:
        data = load_env_data(cfg)
        if args.actions_file:
            jobs = list(read_actions_file(Path(args.actions_file), data, split))
        else:
            jobs = [(split, index, list(task.actions)) for index, task in enumerate(data.tasks(split))]
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rewards = []
    with out.open("w") as sink:
        for job_split, index, actions in jobs:
            record = replay(data, job_split, index, actions)
            rewards.append(record["reward"])
            sink.write(json.dumps(record) + "\n")
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    print(f"replayed {len(rewards)} task(s) -> {out} (mean reward {mean:.3f})")
    return 0
