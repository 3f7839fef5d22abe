"""The desktop's scripted tasks: gold plans of UI actions, drawn from a seed, and each task's
goal state (its gold plan applied once to a fresh desktop, with no faults and no mode).

Six kinds of task, in turn: edit a document, write notes and mail them, change settings,
clean up downloads, triage the inbox, and a mixed one across apps. The bank is a pure
function of (size, seed): every mode, cell and trial that names a task gets the same plan.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from harness.agents.task import Step, Task
from harness.workloads.desktop import apps
from harness.workloads.desktop.tools import TOOLS
from harness.workloads.scripted import ScriptedTask, draw_bank, replay_goal

KINDS: tuple[str, ...] = ("edit_doc", "notes_mail", "settings", "cleanup", "inbox", "mixed")
# Text each document holds from the start, that a find-and-replace may change.
_REPLACEABLE: dict[str, list[tuple[str, str]]] = {
    "docs/report.txt": [("4%", "5%"), ("TODO: add charts", "Charts attached"), ("quarter", "period")],
    "docs/todo.txt": [("plumber", "electrician"), ("renew passport", "renew licence")],
    "docs/letter.txt": [("Sam", "Ms Lee"), ("Kind regards", "Best wishes")],
    "notes/meeting.txt": [("Ana, Bo", "Ana, Bo, Cy")],
}
_LINES = ("- book the venue", "Next steps: draft the budget.", "- water the plants", "Signed off by Ana.")
_TOPICS = ("budget", "offsite", "hiring", "launch")


def _edit_doc(rng: random.Random) -> tuple[str, list[Step]]:
    path = rng.choice(sorted(_REPLACEABLE))
    old, new = rng.choice(_REPLACEABLE[path])
    steps = [Step("open_app", {"app": "editor"}), Step("read_doc", {"path": path}),
             Step("type_text", {"path": path, "text": rng.choice(_LINES)}), Step("read_doc", {"path": path}),
             Step("replace_text", {"path": path, "old": old, "new": new})]
    if rng.random() < 0.5:
        steps.append(Step("type_text", {"path": path, "text": rng.choice(_LINES)}))
    return f"edit {path}", steps


def _notes_mail(rng: random.Random) -> tuple[str, list[Step]]:
    topic = rng.choice(_TOPICS)
    text = f"Notes on the {topic}\n{rng.choice(_LINES)}\n"
    to = rng.choice(apps.CONTACTS)
    steps = [Step("open_app", {"app": "editor"}), Step("read_doc", {"path": "notes/meeting.txt"}),
             Step("new_doc", {"path": f"notes/{topic}.txt", "text": text}),
             Step("open_app", {"app": "mail"}),
             Step("send_mail", {"to": to, "subject": f"Notes: {topic}", "body": text})]
    return f"write notes on the {topic} and mail them to {to}", steps


def _settings(rng: random.Random) -> tuple[str, list[Step]]:
    steps = [Step("open_app", {"app": "settings"}),
             Step("set_setting", {"section": "display", "key": "theme", "value": rng.choice(["dark", "high-contrast"])}),
             Step("toggle_setting", {"section": "notifications", "key": rng.choice(["dnd", "sound"])})]
    if rng.random() < 0.5:
        steps.append(Step("set_setting", {"section": "editor", "key": "tab_width", "value": rng.choice([2, 8])}))
    else:
        section, key = rng.choice([("privacy", "location"), ("editor", "autosave")])
        steps.append(Step("toggle_setting", {"section": section, "key": key}))
    steps.append(Step("open_app", {"app": "settings"}))
    return "change display and notification settings", steps


def _cleanup(rng: random.Random) -> tuple[str, list[Step]]:
    junk, keep = rng.sample(["downloads/setup-old.exe", "downloads/photo-0193.jpg"], 2)
    pdf = rng.choice(["downloads/invoice-1042.pdf", "downloads/receipt-77.pdf"])
    steps = [Step("open_app", {"app": "files"}), Step("trash_file", {"path": junk}),
             Step("move_file", {"path": pdf, "dst": f"docs/{pdf.split('/')[-1]}"})]
    if rng.random() < 0.5:
        steps.append(Step("move_file", {"path": keep, "dst": f"notes/{keep.split('/')[-1]}"}))
    steps.append(Step("open_app", {"app": "files"}))
    return f"trash {junk} and file {pdf}", steps


def _inbox(rng: random.Random) -> tuple[str, list[Step]]:
    read, other, filed = rng.sample(sorted(apps.INITIAL_INBOX), 3)
    sender = apps.INITIAL_INBOX[read]["from"]
    steps = [Step("open_app", {"app": "mail"}), Step("mark_read", {"msg": read}), Step("mark_read", {"msg": other}),
             Step("move_message", {"msg": filed, "folder": rng.choice(["archive", "receipts"])}),
             Step("send_mail", {"to": sender, "subject": f"Re: {apps.INITIAL_INBOX[read]['subject']}",
                                "body": "Thanks, noted."})]
    return f"read {read}, file {filed} and reply to {sender}", steps


def _mixed(rng: random.Random) -> tuple[str, list[Step]]:
    path = rng.choice(["docs/todo.txt", "notes/meeting.txt", "notes/ideas.md"])
    line = rng.choice(_LINES)
    steps = [Step("open_app", {"app": "editor"}), Step("read_doc", {"path": path}),
             Step("type_text", {"path": path, "text": line}),
             Step("open_app", {"app": "settings"}), Step("toggle_setting", {"section": "notifications", "key": "dnd"}),
             Step("open_app", {"app": "files"}),
             Step("trash_file", {"path": rng.choice(["downloads/setup-old.exe", "downloads/photo-0193.jpg"])}),
             Step("open_app", {"app": "mail"}), Step("send_mail", {"to": rng.choice(apps.CONTACTS), "subject": f"Updated {path}", "body": line})]
    return f"update {path}, mute, tidy and tell someone", steps


_MAKERS: dict[str, Callable[[random.Random], tuple[str, list[Step]]]] = {
    "edit_doc": _edit_doc, "notes_mail": _notes_mail, "settings": _settings,
    "cleanup": _cleanup, "inbox": _inbox, "mixed": _mixed,
}


def task_bank(size: int, seed: int) -> list[ScriptedTask]:
    """`size` tasks, the kinds in turn; a pure function of (size, seed)."""
    return draw_bank(_MAKERS, KINDS, size, seed, name="desktop", prefix="desk")


def goal_state(task: Task) -> dict[str, Any]:
    """The desktop after the task's gold plan ran once, directly: where a clean trial ends."""
    return replay_goal(task, apps.setup, TOOLS)
