"""Build the static trajectory viewer: ``index.html``, one page per episode, CSS and a little JS.

    cast-rl view RUN_OR_EVAL_DIR [--out DIR] [--config CONFIG]

The pages are rendered with Jinja2 templates (``cast_rl/viewer/templates/``) and need no server
and no network: open ``index.html`` from disk.  Page structure (what tests and scripts may rely
on)::

    index.html                   one <tr data-episode="ID"> per episode (domain, task, trial,
                                 reward, termination, configuration, critiques, labels),
                                 each critique round of the episode a <span data-critique>;
                                 filter and sort controls (static/viewer.js)
    episodes/ID.html             <article data-episode="ID">: the conversation (system prompt in
                                 a collapsed <details>), tool calls with their arguments, every
                                 verification round as <section data-critique> right after its
                                 proposal, evidence quotes as <mark class="ev ..."> inside the
                                 messages they quote, labeller verdicts beside each action,
                                 and for failed episodes the final database against the gold one
    static/viewer.css, static/viewer.js

Episodes are read as plain JSON (see :mod:`cast_rl.viewer.sources`), so trajectory files from
before or after a format change open as long as the documented keys mean what they meant.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

from cast_rl.critique.context import message_text
from cast_rl.envs.types import is_success
from cast_rl.records import CRITIC_NAME
from cast_rl.viewer.outcome import outcome_diff, resolve_data
from cast_rl.viewer.sources import Source, discover, read_labels, read_records

logger = logging.getLogger(__name__)


def build_viewer(run_dir: str | Path, out: str | Path | None = None, config: str | Path | None = None) -> Path:
    """Write the viewer of ``run_dir`` under ``out`` (default ``<run_dir>/viewer``); returns index.html."""
    import jinja2

    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / "viewer"
    sources = discover(run_dir)
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cast_rl.viewer", "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pretty"] = _pretty
    (out / "episodes").mkdir(parents=True, exist_ok=True)
    _copy_static(out / "static")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cast-viewer-") as scratch:
        data, notes = resolve_data(run_dir, Path(config) if config else None, scratch)
        page = env.get_template("episode.html")
        ids: Counter[str] = Counter()
        for source in sources:
            labels = read_labels(source.labels)
            for position, (lineno, record) in enumerate(read_records(source.trajectories)):
                episode = episode_view(source, lineno, record, labels.get(position, []), ids)
                episode["outcome"] = _outcome(data, record, episode)
                (out / "episodes" / f"{episode['id']}.html").write_text(page.render(e=episode, static="../static"))
                rows.append(_row(episode))
    configurations = list(dict.fromkeys(r["configuration"] for r in rows))
    index = out / "index.html"
    index.write_text(env.get_template("index.html").render(
        rows=rows, notes=notes, run=str(run_dir), static="static",
        configurations=configurations, domains=sorted({r["domain"] for r in rows}),
        summary=_summary(rows, configurations),
    ))
    logger.info("viewer: %d episodes from %d files in %s", len(rows), len(sources), index)
    return index


def episode_view(
    source: Source, lineno: int, record: dict[str, Any], labels: list[dict[str, Any]], ids: Counter[str]
) -> dict[str, Any]:
    """Everything the episode page shows, read defensively from one trajectory line."""
    messages = [m for m in record.get("messages") or [] if isinstance(m, dict)]
    info = record.get("info") if isinstance(record.get("info"), dict) else {}
    rounds = [r for r in record.get("verification_rounds") or [] if isinstance(r, dict)]
    turns = {t.get("message_index"): t for t in record.get("turns") or [] if isinstance(t, dict)}
    if turns:  # counts are read from the turn records (older lines carry them in info)
        info = {**info, **_turn_counts(list(turns.values()))}
    system = next((i for i, m in enumerate(messages) if m.get("role") == "system"), None)
    quotes: dict[int, list[dict[str, str]]] = {}

    round_views: dict[int, list[dict[str, Any]]] = {}
    for n, r in enumerate(rounds):
        critique = r.get("critique") if isinstance(r.get("critique"), dict) else {}
        rationale = critique.get("rationale") if isinstance(critique.get("rationale"), dict) else {}
        ref = f"critique-{n + 1}"
        where = r.get("message_index")
        round_views.setdefault(where if isinstance(where, int) else -1, []).append({
            "n": n + 1, "ref": ref,
            "proposal": r.get("proposal"), "revision": r.get("revision"),
            "verdict": critique.get("verdict", ""), "error_type": critique.get("error_type", ""),
            "critic": critique.get("critic", ""), "text": critique.get("text", ""),
            "rationale": _rationale(rationale),
            "evidence": _evidence(rationale, ref, "ev-critique", f"critique {n + 1}", messages, system, quotes),
        })
    label_views: dict[int, list[dict[str, Any]]] = {}
    for n, label in enumerate(labels):
        rationale = label.get("rationale") if isinstance(label.get("rationale"), dict) else {}
        ref = f"label-{n + 1}"
        label_views.setdefault(label["message_index"], []).append({
            "ref": ref, "action": label.get("action"), "verdict": label.get("verdict", ""),
            "error_type": label.get("error_type", ""), "rationale": _rationale(rationale),
            "decisive": label.get("decisive") is True,  # the action that failed the episode
            "evidence": _evidence(rationale, ref, "ev-label", f"label {n + 1}", messages, system, quotes),
        })

    views = []
    for i, m in enumerate(messages):
        text = message_text(m)
        views.append({
            "index": i, "role": m.get("role", ""), "name": m.get("name") or "",
            "critic": m.get("role") == "user" and m.get("name") == CRITIC_NAME,
            "segments": highlight(text, quotes.get(i, [])), "marks": len(quotes.get(i, [])),
            "chars": len(text),
            "tool_calls": [_call(c) for c in m.get("tool_calls") or [] if isinstance(c, dict)],
            "tool_call_id": m.get("tool_call_id") or "",
            "labels": label_views.get(i, []), "rounds": round_views.get(i, []),
            "turn": turns.get(i),
        })
    key = f"{source.key}-{record.get('domain', '')}-{record.get('split', '')}-t{record.get('task_index', '')}-r{record.get('trial', '')}"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key)
    ids[slug] += 1
    if ids[slug] > 1:
        slug += f"-{ids[slug]}"
    reward = record.get("reward")
    reward = float(reward) if isinstance(reward, (int, float)) else 0.0
    return {
        "id": slug, "source": source.key, "configuration": source.configuration,
        "file": str(source.trajectories), "line": lineno,
        "domain": str(record.get("domain", "")), "split": str(record.get("split", "")),
        "task_index": record.get("task_index", ""), "trial": record.get("trial", ""),
        "reward": reward, "success": is_success(reward), "policy_version": record.get("policy_version", ""),
        "termination": str(info.get("termination", "")), "info": info,
        "messages": views, "rounds": [v for vs in round_views.values() for v in vs],
        "labels": [v for vs in label_views.values() for v in vs],
        "orphan_rounds": [v for k, vs in round_views.items() if not 0 <= k < len(messages) for v in vs],
    }


def highlight(text: str, quotes: list[dict[str, str]]) -> list[dict[str, Any]]:
    """``text`` cut into segments; a segment inside quoted evidence carries its marks.

    Each quote marks its first verbatim occurrence; overlapping quotes share segments.
    """
    spans = []
    for q in quotes:
        start = text.find(q["quote"]) if q["quote"] else -1
        if start >= 0:
            spans.append((start, start + len(q["quote"]), q))
    bounds = sorted({0, len(text), *(s for s, _, _ in spans), *(e for _, e, _ in spans)})
    segments: list[dict[str, Any]] = []
    for a, b in zip(bounds, bounds[1:]):
        marks = [q for s, e, q in spans if s <= a and b <= e]
        segments.append({
            "text": text[a:b], "marks": marks,
            "css": " ".join(sorted({q["css"] for q in marks})),
            "title": "; ".join(q["title"] for q in marks),
            "refs": " ".join(q["ref"] for q in marks),
        })
    return segments


def _evidence(
    rationale: dict[str, Any], ref: str, css: str, title: str, messages: list[dict[str, Any]],
    system: int | None, quotes: dict[int, list[dict[str, str]]],
) -> list[dict[str, Any]]:
    out = []
    for item in rationale.get("evidence") or []:
        if not isinstance(item, dict) or not isinstance(item.get("quote"), str):
            continue
        index = item.get("message_index")
        target = system if index is None else index
        found = (isinstance(target, int) and 0 <= target < len(messages)
                 and item["quote"] in message_text(messages[target]))
        if found:
            quotes.setdefault(target, []).append({"quote": item["quote"], "css": css, "title": title, "ref": ref})
        out.append({"message_index": target, "policy": index is None, "quote": item["quote"], "found": found})
    return out


def _rationale(r: dict[str, Any]) -> dict[str, str]:
    return {key: str(r.get(key) or "") for key in ("explanation", "policy_clause", "suggested_fix")}


def _call(call: dict[str, Any]) -> dict[str, str]:
    function = call.get("function") if isinstance(call.get("function"), dict) else call
    arguments = function.get("arguments", "")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return {"name": str(function.get("name", "")), "arguments": arguments, "id": str(call.get("id", ""))}
    return {"name": str(function.get("name", "")), "arguments": _pretty(arguments), "id": str(call.get("id", ""))}


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _outcome(data: dict[str, Any], record: dict[str, Any], episode: dict[str, Any]) -> dict[str, Any]:
    if episode["success"]:
        return {"status": "success"}
    domain = episode["domain"]
    if domain not in data:
        return {"status": "unavailable", "note": f"no {domain or 'domain'} data resolved for this run (see the index)"}
    try:
        return {"status": "compared", **outcome_diff(data[domain], record)}
    except (IndexError, ValueError, KeyError) as exc:  # a task the data directory does not have
        return {"status": "unavailable", "note": f"could not replay the episode: {exc}"}


def _row(e: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": e["id"], "href": f"episodes/{e['id']}.html", "configuration": e["configuration"],
        "domain": e["domain"], "split": e["split"], "task_index": e["task_index"], "trial": e["trial"],
        "reward": e["reward"], "success": e["success"], "termination": e["termination"],
        "critiques": [{"ref": r["ref"], "verdict": r["verdict"], "error_type": r["error_type"]} for r in e["rounds"]],
        "labels": len(e["labels"]), "invalid": sum(1 for lab in e["labels"] if lab["verdict"] == "invalid"),
    }


def _summary(rows: list[dict[str, Any]], configurations: list[str]) -> list[dict[str, Any]]:
    out = []
    for name in configurations:
        mine = [r for r in rows if r["configuration"] == name]
        out.append({"configuration": name, "episodes": len(mine),
                    "success_rate": sum(r["success"] for r in mine) / len(mine),
                    "critiques": sum(len(r["critiques"]) for r in mine)})
    return out


def _copy_static(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for item in resources.files("cast_rl.viewer").joinpath("static").iterdir():
        if item.is_file():
            with resources.as_file(item) as path:
                shutil.copyfile(path, out / item.name)


def _turn_counts(turns: list[dict[str, Any]]) -> dict[str, int]:
    """The counts :class:`~cast_rl.records.Trajectory` reads from its turns, from raw records."""
    def num(t: dict[str, Any], key: str) -> int:
        value = t.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return {
        "policy_tokens": sum(num(t, "end") - num(t, "start") for t in turns if not t.get("substituted")),
        "prompt_tokens": sum(num(t, "prompt_tokens") for t in turns),
        "malformed_calls": sum(1 for t in turns if t.get("error") is not None),
    }
