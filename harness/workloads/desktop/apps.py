"""The desktop that the PROXY for paper Table 5's OSWorld columns runs on (not OSWorld).

Four apps over one trial's real substrates: an editor whose documents are real files
(`TrialEnv.files`), a file manager with a trash folder (real files), a mail client whose
inbox is a SQLite table and whose sent mail goes through the real append-only mailbox, and a
settings store (SQLite). Each action performs one UI action on the substrate, with the
delivery's idempotency key (derived per write when one action writes twice) and its op-log
metadata.

Scopes follow paper Table 4's OSWorld adapter (a UI app scope with a text-input or region
suffix), spelt as plain names of kind `ui`: `ui:editor:docs/report.txt:text_input`,
`ui:settings:display:theme`, `ui:mail:inbox:m3`. An action that changes a file also names
the file's own `fs:` scope, since the editor and the file manager are two views of one file.
Read-only actions carry no scope (Table 4).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from atomix.scope_kinds import named_scope
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolError

Meta = Mapping[str, Any]
APPS: tuple[str, ...] = ("editor", "files", "mail", "settings")
TRASH = "Trash"
FOLDERS: tuple[str, ...] = ("inbox", "archive", "receipts")

INITIAL_FILES: dict[str, str] = {
    "docs/report.txt": "Quarterly report\nRevenue grew 4% over the quarter.\nTODO: add charts\n",
    "docs/todo.txt": "- call the plumber\n- renew passport\n",
    "docs/letter.txt": "Dear Sam,\nthank you for the offer.\nKind regards\n",
    "notes/meeting.txt": "Meeting notes\nAttendees: Ana, Bo\n",
    "notes/ideas.md": "# Ideas\n- a garden bench\n",
    "downloads/invoice-1042.pdf": "%PDF invoice 1042\n",
    "downloads/setup-old.exe": "MZ old installer\n",
    "downloads/photo-0193.jpg": "JPEG holiday photo\n",
    "downloads/receipt-77.pdf": "%PDF receipt 77\n",
}
# section.key -> initial value; a setting keeps the type of its initial value.
INITIAL_SETTINGS: dict[str, Any] = {
    "display.theme": "light",
    "display.font_size": 12,
    "notifications.sound": True,
    "notifications.dnd": False,
    "privacy.location": True,
    "editor.autosave": False,
    "editor.tab_width": 4,
}
INITIAL_INBOX: dict[str, dict[str, Any]] = {
    f"m{i}": {"from": sender, "subject": subject, "read": False, "folder": "inbox"}
    for i, (sender, subject) in enumerate(
        [("bob@example.com", "Lunch on Friday?"), ("hr@example.com", "Holiday calendar"),
         ("shop@example.com", "Your receipt"), ("sam@example.com", "About the offer"),
         ("team@example.com", "Sprint review"), ("bank@example.com", "Statement ready")],
        start=1,
    )
}
CONTACTS: tuple[str, ...] = ("bob@example.com", "sam@example.com", "team@example.com", "hr@example.com")


# -- scopes ---------------------------------------------------------------------------------------
def ui(*parts: str) -> str:
    """`ui:<app>:<element...>`: an app, or an element of an app's window."""
    return str(named_scope(":".join(("ui", *parts))))


def doc_path(path: str) -> str:
    """A document path as the apps show it (relative, normalised); refuses one outside."""
    if not isinstance(path, str) or not path or path.startswith("/"):
        raise ToolError(f"no such document {path!r}: paths are relative, e.g. docs/todo.txt")
    norm = posixpath.normpath(path)
    if norm.startswith("..") or ":" in norm:
        raise ToolError(f"no such document {path!r}")
    return norm


def trash_path(path: str) -> str:
    return f"{TRASH}/{posixpath.basename(doc_path(path))}"


def setting_name(section: str, key: str) -> str:
    name = f"{section}.{key}"
    if name not in INITIAL_SETTINGS:
        raise ToolError(f"no setting {name!r}; settings: {', '.join(INITIAL_SETTINGS)}")
    return name


# -- state ----------------------------------------------------------------------------------------
def setup(env: TrialEnv) -> None:
    """The desktop when the trial starts, written directly (no agent: the oracle ignores it)."""
    for path, text in INITIAL_FILES.items():
        env.files.write(path, text)
    env.db.put_many([("settings", k, {"value": v}) for k, v in INITIAL_SETTINGS.items()]
                    + [("inbox", m, row) for m, row in INITIAL_INBOX.items()])


def _sub(key: str | None, part: str) -> str | None:
    """The key of one write of a two-write action: applied at most once per action key."""
    return None if key is None else f"{key}#{part}"


def replayed(store: Any, key: str | None) -> bool:
    """Whether a delivery with this key was already applied to `store` (the files or the
    database): the app then answers without acting or re-checking."""
    return key is not None and key in store.applied_keys()


def _text(env: TrialEnv, path: str, *, log_read: bool = False, meta: Meta | None = None) -> str:
    text = env.files.read_text(doc_path(path), log_read=log_read, meta=meta)
    if text is None:
        raise ToolError(f"no such document {path!r}")
    return text


# -- read-only UI actions -------------------------------------------------------------------------
def open_app(env: TrialEnv, app: str, meta: Meta) -> str:
    """The app's window as text."""
    if app in ("editor", "files"):
        names = [p for p in env.files.snapshot() if app == "files" or not p.startswith(f"{TRASH}/")]
        return f"{app} | " + "; ".join(names)
    if app == "mail":
        rows = [(m, env.db.get("inbox", m, log_read=True, meta=meta)) for m in INITIAL_INBOX]
        return "mail | " + "; ".join(f"{m} [{r['folder']}{'' if r['read'] else ', unread'}] {r['subject']}" for m, r in rows)
    if app == "settings":
        return "settings | " + "; ".join(
            f"{k}={env.db.get('settings', k, log_read=True, meta=meta)['value']}" for k in INITIAL_SETTINGS)
    raise ToolError(f"no app {app!r}; apps: {', '.join(APPS)}")


def read_doc(env: TrialEnv, path: str, meta: Meta) -> str:
    return _text(env, path, log_read=True, meta=meta)


# -- editor ---------------------------------------------------------------------------------------
def type_text(env: TrialEnv, path: str, text: str, d: Delivery) -> int:
    """Type a line at the end of the document (autosaved)."""
    content = _text(env, path) + text + "\n"
    env.files.write(doc_path(path), content, key=d.key, meta=d.meta)
    return len(content)


def replace_text(env: TrialEnv, path: str, old: str, new: str, d: Delivery) -> int:
    """Find and replace every occurrence (autosaved); refused when there is none."""
    if replayed(env.files, d.key):
        return 0
    content = _text(env, path)
    count = content.count(old) if old else 0
    if count == 0:
        raise ToolError(f"{old!r} not found in {path}")
    env.files.write(doc_path(path), content.replace(old, new), key=d.key, meta=d.meta)
    return count


def check_contains(env: TrialEnv, path: str, old: str) -> None:
    if not old or old not in _text(env, path):
        raise ToolError(f"{old!r} not found in {path}")


def new_doc(env: TrialEnv, path: str, text: str, d: Delivery) -> str:
    """Save a new document (replacing one of that name)."""
    env.files.write(doc_path(path), text, key=d.key, meta=d.meta)
    return path


# -- file manager ---------------------------------------------------------------------------------
def check_exists(env: TrialEnv, path: str) -> None:
    if not env.files.exists(doc_path(path)):
        raise ToolError(f"no such file {path!r}")


def move_file(env: TrialEnv, src: str, dst: str, d: Delivery) -> str:
    """Move (or rename) a file; refused when `src` is gone or `dst` exists."""
    if replayed(env.files, _sub(d.key, "src")):
        return dst
    check_move(env, src, dst)
    data = env.files.read(doc_path(src))
    assert data is not None
    env.files.write(doc_path(dst), data, key=_sub(d.key, "dst"), meta=d.meta)
    env.files.delete(doc_path(src), key=_sub(d.key, "src"), meta=d.meta)
    return dst


def check_move(env: TrialEnv, src: str, dst: str) -> None:
    check_exists(env, src)
    if env.files.exists(doc_path(dst)):
        raise ToolError(f"{dst!r} already exists")


def trash_file(env: TrialEnv, path: str, d: Delivery) -> str:
    """Move a file to the trash (restorable from there)."""
    return move_file(env, path, trash_path(path), d)


def files_before(env: TrialEnv, paths: list[str]) -> dict[str, bytes | None]:
    return {p: env.files.before_image(doc_path(p)) for p in paths}


def restore_files(env: TrialEnv, before: Mapping[str, bytes | None], d: Delivery) -> None:
    for path, data in before.items():
        key = _sub(d.key, f"undo:{path}")
        if data is None:
            env.files.delete(path, key=key, meta=d.meta)
        else:
            env.files.write(path, data, key=key, meta=d.meta)


# -- settings -------------------------------------------------------------------------------------
def set_setting(env: TrialEnv, section: str, key: str, value: Any, d: Delivery) -> Any:
    check_setting(env, section, key, value)
    env.db.put("settings", setting_name(section, key), {"value": value}, key=d.key, meta=d.meta)
    return value


def check_setting(env: TrialEnv, section: str, key: str, value: Any) -> None:
    name = setting_name(section, key)
    if type(value) is not type(INITIAL_SETTINGS[name]):
        raise ToolError(f"{name} takes a {type(INITIAL_SETTINGS[name]).__name__}, got {value!r}")


def toggle_setting(env: TrialEnv, section: str, key: str, d: Delivery) -> bool:
    """Click a switch: on becomes off and off becomes on."""
    check_switch(env, section, key)
    name = setting_name(section, key)
    value = not env.db.get("settings", name)["value"]
    env.db.put("settings", name, {"value": value}, key=d.key, meta=d.meta)
    return value


def check_switch(env: TrialEnv, section: str, key: str) -> None:
    name = setting_name(section, key)
    if not isinstance(INITIAL_SETTINGS[name], bool):
        raise ToolError(f"{name} is not a switch")


# -- mail client ----------------------------------------------------------------------------------
def _message(env: TrialEnv, msg: str) -> dict[str, Any]:
    row = env.db.get("inbox", msg) if isinstance(msg, str) else None
    if row is None:
        raise ToolError(f"no message {msg!r}")
    return row


def mark_read(env: TrialEnv, msg: str, d: Delivery) -> None:
    env.db.put("inbox", msg, {**_message(env, msg), "read": True}, key=d.key, meta=d.meta)


def move_message(env: TrialEnv, msg: str, folder: str, d: Delivery) -> None:
    check_folder(env, msg, folder)
    env.db.put("inbox", msg, {**_message(env, msg), "folder": folder}, key=d.key, meta=d.meta)


def check_folder(env: TrialEnv, msg: str, folder: str) -> None:
    _message(env, msg)
    if folder not in FOLDERS:
        raise ToolError(f"no folder {folder!r}; folders: {', '.join(FOLDERS)}")


def send_mail(env: TrialEnv, to: str, subject: str, body: str, d: Delivery) -> bool:
    """Compose and send: the message leaves at once and can never be unsent."""
    return env.mailbox.send(to, subject, body, key=d.key, meta=d.meta)
